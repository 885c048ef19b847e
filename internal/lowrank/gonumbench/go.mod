// This module only benchmarks package lowrank against gonum's pure-Go BLAS
// on ResNet-50's matrices; it is a module of its own so that ddpgo itself
// does not depend on gonum.
module github.com/ddpgo/ddpgo/internal/lowrank/gonumbench

go 1.26

require (
	github.com/ddpgo/ddpgo v0.0.0
	gonum.org/v1/gonum v0.17.0
)

require golang.org/x/sys v0.38.0 // indirect

replace github.com/ddpgo/ddpgo => ../../..
