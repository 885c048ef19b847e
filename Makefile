# The test command of the README. Each line is one package set under the
# flags it needs: the race detector on everything, the invariants build tag
# (pebble-style expensive assertions) on everything, and the pure-Go kernels
# forced with the purego tag so both implementations are checked.
#
# The MPI backend (package mpi, build tag mpi, cgo) is tested where Open
# MPI's development files are installed (make mpi-deps): alone as a 1-rank
# world, then under mpirun with 2 and 3 ranks (its TestUnderMpirun starts
# the jobs; DDPGO_MPI_NP=1,2,3,4 changes the counts). Elsewhere those lines
# say so and are skipped, unless DDPGO_REQUIRE_MPI=1 (CI) makes that an
# error.
GO ?= go
HAVE_MPI := $(shell pkg-config --exists ompi-c 2>/dev/null && command -v mpirun >/dev/null && echo yes)

.PHONY: test test-mpi lint lint-mpi mpi-deps peers-deps compare

test: lint
	$(GO) test -race -tags invariants ./...
	$(GO) test -tags purego ./fp16/ ./internal/... ./inproc/ ./hooks/
	$(GO) test -run Exhaustive -count=1 ./fp16/
	@$(MAKE) --no-print-directory test-mpi

test-mpi:
ifeq ($(HAVE_MPI),yes)
	$(GO) test -race -tags mpi,invariants ./mpi/
else
	@if [ "$$DDPGO_REQUIRE_MPI" = 1 ]; then echo "mpi tests: Open MPI not found (pkg-config ompi-c, mpirun); run make mpi-deps"; exit 1; fi
	@echo "mpi tests skipped: Open MPI not found (pkg-config ompi-c, mpirun); make mpi-deps installs it"
endif

lint: lint-mpi
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would rewrite:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags purego ./...

lint-mpi:
ifeq ($(HAVE_MPI),yes)
	$(GO) vet -tags mpi ./mpi/ ./launch/
endif

# Open MPI's development files and mpirun, from Debian's packages.
mpi-deps:
	apt-get update
	DEBIAN_FRONTEND=noninteractive apt-get install -y openmpi-bin libopenmpi-dev pkg-config

# The peers of ../shared/peers (PyTorch with gloo, Open MPI, numpy) from
# Debian's packages; scripts/compare.sh runs them beside ddpgo.
peers-deps:
	apt-get update
	DEBIAN_FRONTEND=noninteractive apt-get install -y python3-torch python3-torchvision python3-numpy openmpi-bin libopenmpi-dev gcc

compare:
	scripts/compare.sh
