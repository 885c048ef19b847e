# The test command of the README. Each line is one package set under the
# flags it needs: the race detector on everything, the invariants build tag
# (pebble-style expensive assertions) on everything, the NCCL backend over
# its stand-in following each NCCL completion rule (2.26's, the default,
# then 2.21's immediate enqueue, 2.23-2.25's lazy join and 2.27+'s jobs
# off the thread: DDPGO_STANDIN_NCCL, which the tests read, so Go's test
# cache keys on it), and the pure-Go kernels forced
# with the purego tag so both implementations are checked. The tests the
# race detector makes meaningless (allocation counts) or too slow (the
# digits example's accuracy) run once more without it. A module outside
# the repository is built against ddpgo by the README's recipe
# (scripts/outside-module.sh). docs/guide/testing.md
# lists every test that skips, and why.
#
# The MPI backend (package mpi, build tag mpi, cgo) is tested where Open
# MPI's development files are installed (make mpi-deps): alone as a 1-rank
# world, then under mpirun with 2 and 3 ranks (its TestUnderMpirun starts
# the jobs; DDPGO_MPI_NP=1,2,3,4 changes the counts). Elsewhere those lines
# say so and are skipped, unless DDPGO_REQUIRE_MPI=1 (CI) makes that an
# error.
GO ?= go
HAVE_MPI := $(shell pkg-config --exists ompi-c 2>/dev/null && command -v mpirun >/dev/null && echo yes)

.PHONY: test quick test-gomlx test-mpi test-net lint lint-mpi mpi-deps ptxas-deps cuda-dev-deps peers-deps compare fuzz soak gpu-check-bin

test: lint
	$(GO) test -race -tags invariants -timeout 20m ./...
	@for v in 2.21 2.25 2.28; do echo "nccl over its stand-in as NCCL $$v:"; DDPGO_STANDIN_NCCL=$$v $(GO) test -race -tags invariants ./nccl/ || exit 1; done
	DDPGO_STANDIN_NCCL=2.21 $(GO) test -count=1 -run NCCL ./cmd/ddpbench/
	$(GO) test -tags purego ./fp16/ ./internal/... ./inproc/ ./hooks/
	$(GO) test -run Exhaustive -count=1 ./fp16/
	$(GO) test -run '^(TestAccuracy|TestPowerSGDAccuracy|TestRunAllocations)$$' -count=1 ./examples/digits/ ./bench/
	@$(MAKE) --no-print-directory test-gomlx
	scripts/outside-module.sh
	@$(MAKE) --no-print-directory test-mpi
	@$(MAKE) --no-print-directory test-net

# The developer's loop, a few times quicker than make test: lint, the core
# (the reducer and the packages under it) under the race detector and the
# invariants tag, and every other package without them, all in short mode:
# no 2^32 fp16 walk, no 8 MiB conformance cases, no jobs under mpirun, no
# network faults, no GoMLX integration. make test is the whole suite, and
# what CI runs.
CORE := ./fp16/ ./allocator/ ./bucket/ ./comm/... ./inproc/ ./hooks/ ./ddp/... ./sampler/ ./launch/ ./internal/reduce/ ./internal/lowrank/
quick: lint
	$(GO) test -short -race -tags invariants $(CORE)
	$(GO) test -short $$({ $(GO) list ./...; $(GO) list $(CORE); } | sort | uniq -u)

# The GoMLX integration, a module of its own (integrations/gomlx): it builds
# without cgo; its trainer's tests run under the race detector, its
# example's without (simplego runs several times slower under it). Their
# jobs under mpirun build with the mpi tag themselves and follow the mpi
# tests' rule (internal/mpitest): skipped without Open MPI, an error under
# DDPGO_REQUIRE_MPI=1. About 45 s on 2 cores (docs/lab/gomlx.md). The
# example's one test whose ranks all print runs under the race detector too.
test-gomlx:
	cd integrations/gomlx && CGO_ENABLED=0 $(GO) build ./...
	cd integrations/gomlx && $(GO) test -race ./ddptrain/
	cd integrations/gomlx && $(GO) test ./examples/...
	cd integrations/gomlx && $(GO) test -race -run '^TestShardFlag$$' ./examples/digitscnn/

test-mpi:
ifeq ($(HAVE_MPI),yes)
	$(GO) test -race -tags mpi,invariants -timeout 20m ./mpi/
else
	@if [ "$$DDPGO_REQUIRE_MPI" = 1 ]; then echo "mpi tests: Open MPI not found (pkg-config ompi-c, mpirun); run make mpi-deps"; exit 1; fi
	@echo "mpi tests skipped: Open MPI not found (pkg-config ompi-c, mpirun); make mpi-deps installs it"
endif

# Faults over a real network stack (scripts/netfaults.sh: a link cut and
# restored, cut for good, a rank stopped, a rank killed, over 2 test hosts
# joined by 1 Gbit/s links; and the hierarchical path across those hosts:
# its conformance on 2 x 2 and 3 + 1 ranks, a rank stopped, killed or
# exiting inside either phase). They need root, network namespaces and Open
# MPI; elsewhere they are skipped with the reason, unless DDPGO_REQUIRE_NET=1
# makes that an error. About two and a half minutes.
test-net:
	@rc=0; scripts/netfaults.sh || rc=$$?; \
	if [ $$rc = 2 ]; then \
		if [ "$$DDPGO_REQUIRE_NET" = 1 ]; then echo "network fault tests required (DDPGO_REQUIRE_NET=1) but skipped"; exit 1; fi; \
		echo "network fault tests skipped (the reason is above)"; \
	elif [ $$rc != 0 ]; then exit $$rc; fi

lint: lint-mpi
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would rewrite:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags purego ./...
	cd integrations/gomlx && $(GO) vet ./...

lint-mpi:
ifeq ($(HAVE_MPI),yes)
	$(GO) vet -tags mpi ./mpi/ ./launch/
endif

# Open MPI's development files and mpirun, from Debian's packages.
mpi-deps:
	apt-get update
	DEBIAN_FRONTEND=noninteractive apt-get install -y openmpi-bin libopenmpi-dev pkg-config

# NVIDIA's ptxas (and cuobjdump) from CUDA 11.8, Debian's
# nvidia-cuda-toolkit in the non-free component, unpacked into
# .cache/cuda/bin, not installed: nccl's TestPTXAssembles assembles
# kernels.ptx with it for sm_52, sm_70, sm_80 and sm_90, and skips where
# no ptxas is found unless DDPGO_REQUIRE_PTXAS=1 (CI). Needs root: it adds
# contrib and non-free to the Debian sources entry. An 84 MB download.
CUDA_CACHE := .cache/cuda
ptxas-deps:
	scripts/cuda-deps.sh ptxas $(CUDA_CACHE)

# CUDA 11.8's headers (cuda.h, cuda_runtime.h; from nvidia-cuda-dev, a
# 774 MB download) in .cache/cuda/include, for nccl's
# TestABIAgainstHeaders, which compiles the binding's function types
# against cuda.h (and nccl.h, made from NCCL's nccl.h.in when
# DDPGO_NCCL_H_IN names one). Not in CI: about a minute and a half.
cuda-dev-deps:
	scripts/cuda-deps.sh headers $(CUDA_CACHE)

# What the peer baselines of scripts/peers need (PyTorch with gloo, numpy,
# Open MPI, a C compiler), from Debian's packages; scripts/compare.sh runs
# them beside ddpgo.
peers-deps:
	apt-get update
	DEBIAN_FRONTEND=noninteractive apt-get install -y python3-torch python3-numpy openmpi-bin libopenmpi-dev gcc

compare:
	scripts/compare.sh

# Every native fuzz target for FUZZTIME each (one at a time: go test fuzzes
# one target per run). The seed corpora in each package's testdata/fuzz run
# in make test as ordinary tests; what a run finds is written there too.
FUZZTIME ?= 60s
FUZZ_TARGETS := \
	bucket:FuzzAssign bucket:FuzzDecode \
	fp16:FuzzConvert fp16:FuzzSum \
	internal/reduce:FuzzSumFloat32 internal/reduce:FuzzTwiceKernels internal/reduce:FuzzTwiceNT internal/reduce:FuzzAvg \
	comm:FuzzAnyNonfinite comm:FuzzHalfAdd comm/shm:FuzzInterleaving \
	comm/backend:FuzzCheck comm/backend:FuzzRing \
	ddp:FuzzSchedule ddp:FuzzSequence models:FuzzParse cmd/ddpbench:FuzzParseSize \
	rendezvous:FuzzServer \
	trace/tracetest:FuzzValidate trace/tracetest:FuzzWriter

fuzz:
	@log=$$(mktemp); trap 'rm -f "$$log"' EXIT; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t#*:}; \
		echo "== $$fn ($$pkg), $(FUZZTIME)"; \
		if ! $(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) ./$$pkg/ > "$$log" 2>&1; then \
			cat "$$log"; exit 1; fi; \
		grep -E '^fuzz: elapsed' "$$log" | tail -n 1; \
	done

# The soak: 10,000 steps of 4 in-process ranks, every reduced gradient
# checked bit for bit against the sequential average, heap, pool and
# goroutines checked flat (ddp's TestSoak; make test runs 60 steps).
SOAK_STEPS ?= 10000
soak:
	DDPGO_SOAK_STEPS=$(SOAK_STEPS) $(GO) test -run '^TestSoak$$' -count=1 -timeout 60m -v ./ddp/

# The binaries scripts/gpu-check.sh runs on a GPU machine that has no Go:
# the nccl package's test binary and ddpbench, in BIN.
BIN ?= bin/gpu-check
gpu-check-bin:
	mkdir -p $(BIN)
	CGO_ENABLED=1 $(GO) test -c -ldflags=-s -o $(BIN)/nccl.test ./nccl
	CGO_ENABLED=1 $(GO) build -ldflags=-s -o $(BIN)/ddpbench ./cmd/ddpbench
