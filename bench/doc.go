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
// goroutine per rank, or the one rank of this process in a job launched
// with a process per rank; each rank issues the same collective sequence.
//
// A device backend (NCCL) is measured on device memory: with
// CollectiveConfig.Device each rank's buffers come from a CommPool over
// its communicator's own Source (DeviceMemory), and with device Pools in
// Config the simulated backward writes the gradients with the
// communicator's kernels and the check downloads them. Inputs are filled
// on the host and uploaded, and results downloaded to be checked, outside
// the timed loops; nothing timed passes through host memory.
package bench
