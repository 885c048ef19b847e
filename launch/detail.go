package launch

import (
	"fmt"

	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/comm/checked"
)

// detailed wraps cs as DDPGO_DISTRIBUTED_DEBUG=DETAIL asks, when it does.
func detailed(backend string, cs []comm.Communicator) ([]comm.Communicator, error) {
	if !checked.Requested() {
		return cs, nil
	}
	return wrapChecked(backend, cs)
}

// wrapChecked wraps every communicator in cs with package checked, as
// DDPGO_DISTRIBUTED_DEBUG=DETAIL asks; on failure it closes them all.
func wrapChecked(backend string, cs []comm.Communicator) ([]comm.Communicator, error) {
	out := make([]comm.Communicator, 0, len(cs))
	for _, c := range cs {
		w, err := checked.Wrap(c, checked.Options{})
		if err != nil {
			for _, o := range out {
				o.Close()
			}
			for _, c := range cs[len(out):] {
				c.Close()
			}
			return nil, fmt.Errorf("launch: %s=DETAIL: backend %s, rank %d: %w", checked.EnvVar, backend, c.Rank(), err)
		}
		out = append(out, w)
	}
	return out, nil
}
