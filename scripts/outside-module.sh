#!/usr/bin/env bash
# Builds a throwaway module outside the repository against ddpgo and its GoMLX integration, as a
# user's own module would, by the README's recipe ("From your own module"): ddpgo is not served by
# the module proxy, and integrations/gomlx's own replace of ddpgo (=> ../..) does not carry over to a
# module that requires it, so the user's go.mod replaces both modules with the clone's directories.
#
# The module runs one step of two in-process ranks through ddp's reducer and checks the average,
# then builds (does not run) a program that hands a GoMLX model to ddptrain. It works offline once
# `go mod download` ran in the repository and in integrations/gomlx, as CI does: the module's
# go.sum starts from theirs, so no checksum has to be fetched, and GOPROXY is left as it is set.
#
#   scripts/outside-module.sh
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The go command may change the module's go.mod and go.sum (the user's go mod tidy), whatever
# GOFLAGS the caller set (CI: -mod=readonly).
export GOFLAGS=-mod=mod
cd "$tmp"

cat >go.mod <<'EOF'
module example.com/mytrainer

go 1.26
EOF
# The recipe: the two replace lines.
go mod edit -replace github.com/ddpgo/ddpgo="$root" \
	-replace github.com/ddpgo/ddpgo/integrations/gomlx="$root/integrations/gomlx"
cat "$root/go.sum" "$root/integrations/gomlx/go.sum" | sort -u >go.sum

cat >main.go <<'EOF'
// Command mytrainer averages one gradient over two in-process ranks.
package main

import (
	"context"
	"fmt"
	"log"
	"sync"

	"github.com/ddpgo/ddpgo/ddp"
	"github.com/ddpgo/ddpgo/launch"
)

func main() {
	ctx := context.Background()
	cs, err := launch.Open(ctx, "inproc", launch.Options{Ranks: 2})
	if err != nil {
		log.Fatal(err)
	}
	got := make([][]float32, len(cs))
	var wg sync.WaitGroup
	for r, c := range cs {
		wg.Go(func() {
			defer c.Close()
			red, err := ddp.New(ctx, c, []ddp.Param{{Name: "w", Shape: []int{4}}}, ddp.Options{})
			if err != nil {
				log.Fatal(err)
			}
			defer red.Close()
			g := float32(r + 1) // rank 0's gradient is all 1, rank 1's all 2
			if err := red.Begin(ddp.Sync); err != nil {
				log.Fatal(err)
			}
			if err := red.SetGrad(0, []float32{g, g, g, g}); err != nil { // and marks it ready
				log.Fatal(err)
			}
			if err := red.Wait(ctx); err != nil {
				log.Fatal(err)
			}
			avg, err := red.Grad(0)
			if err != nil {
				log.Fatal(err)
			}
			got[r] = append([]float32(nil), avg...)
		})
	}
	wg.Wait()
	fmt.Println(got[0], got[1])
}
EOF

mkdir gomlx
cat >gomlx/main.go <<'EOF'
// Command gomlx hands a GoMLX model to ddptrain: it is built, not run.
package main

import (
	"fmt"

	"github.com/ddpgo/ddpgo/integrations/gomlx/ddptrain"
)

func main() {
	fmt.Printf("%T\n", ddptrain.New)
}
EOF

# Building with -mod=mod records the requirements, as go mod tidy does; tidy itself would also want
# the modules of the dependencies' tests (testify, go-xla), which go mod download does not fetch.
go build -o /dev/null ./gomlx
go vet ./...
out=$(go run .)
if [[ $out != "[1.5 1.5 1.5 1.5] [1.5 1.5 1.5 1.5]" ]]; then
	echo "outside-module: two ranks averaged 1 and 2 into $out, want 1.5 on both" >&2
	exit 1
fi
echo "outside-module: a module outside the repository built against ddpgo and integrations/gomlx, and ran"
