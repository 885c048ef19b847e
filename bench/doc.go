// Package bench drives ddpgo benchmarks: nccl-tests style collective
// sweeps over a group of communicators (RunCollective), and data-parallel
// training steps over a model manifest with a simulated backward pass
// (Run), which reports step time, backward compute, communication, their
// overlap and the achieved bus bandwidth.
//
// The simulated backward walks the parameters in reverse registration
// order, as autograd produces gradients, and spaces their ready marks by a
// compute rate (parameters per second) on a deadline schedule: rank k's
// gradient i becomes ready at start + (sum of the numels walked so far) /
// rate, whatever the granularity of the sleep, so timing error does not
// accumulate. With no compute, every gradient is marked ready at once and
// the step measures the reducer's pure synchronization overhead.
//
// Everything here runs every rank of a group in this process, one
// goroutine per rank; each rank issues the same collective sequence.
package bench
