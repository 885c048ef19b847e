# The test command of the README. Each line is one package set under the
# flags it needs: the race detector on everything, the invariants build tag
# (pebble-style expensive assertions) on everything, and the pure-Go kernels
# forced with the purego tag so both implementations are checked.
GO ?= go

.PHONY: test lint peers-deps compare

test: lint
	$(GO) test -race -tags invariants ./...
	$(GO) test -tags purego ./fp16/ ./internal/... ./inproc/ ./hooks/
	$(GO) test -run Exhaustive -count=1 ./fp16/

lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would rewrite:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags purego ./...

# The peers of ../shared/peers (PyTorch with gloo, Open MPI, numpy) from
# Debian's packages; scripts/compare.sh runs them beside ddpgo.
peers-deps:
	apt-get update
	DEBIAN_FRONTEND=noninteractive apt-get install -y python3-torch python3-torchvision python3-numpy openmpi-bin libopenmpi-dev gcc

compare:
	scripts/compare.sh
