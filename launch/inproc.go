package launch

import (
	"context"
	"fmt"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/inproc"
)

// The embedded backend registers here, since launch imports it anyway: a
// program that imports launch can always open "inproc".
func init() {
	Register(Backend{Name: "inproc", SharedMemory: true, About: "goroutines of this process sharing memory", Open: openInproc})
}

// openInproc starts Job.Ranks goroutine ranks; Config may be an
// inproc.Options value.
func openInproc(_ context.Context, job Job) ([]comm.Communicator, error) {
	var o inproc.Options
	switch cfg := job.Config.(type) {
	case nil:
	case inproc.Options:
		o = cfg
	default:
		return nil, fmt.Errorf("%w: inproc takes inproc.Options as Config, not %T", comm.ErrInvalid, job.Config)
	}
	g, err := inproc.NewGroupWith(job.Ranks, o)
	if err != nil {
		return nil, err
	}
	cs := make([]comm.Communicator, len(g))
	for i, c := range g {
		cs[i] = c
	}
	return cs, nil
}
