package main

import "github.com/ddpgo/ddpgo/sampler"

// trainLocal is the single-process reference: the same model, data order
// and optimizer as train, with the whole batch on one replica and no
// communication.
func trainLocal(train *dataset, cfg config, log func(epoch int, m *mlp)) *mlp {
	m := newMLP(cfg.Seed, Pixels, cfg.Hidden, Classes)
	g := make([][]float32, numParams)
	for i, w := range m.values() {
		g[i] = make([]float32, len(w))
	}
	grad := func(i int) ([]float32, error) { return g[i], nil }
	opt := newSGD(m.values(), float32(cfg.LR), float32(cfg.Momentum))
	var x []float32
	var y []int32
	var order []int
	smp, err := sampler.New(train.len(), 1, 0, sampler.Options{Shuffle: true, Seed: cfg.Seed, DropLast: true})
	if err != nil {
		panic(err)
	}
	for epoch := range cfg.Epochs {
		order = smp.Epoch(epoch, order) // one rank: the whole epoch's order
		for b := range train.len() / cfg.Batch {
			x, y = train.gather(x, y, order[b*cfg.Batch:(b+1)*cfg.Batch])
			m.forward(x, y)
			_ = m.backward(grad, func(int) error { return nil })
			_ = opt.step(m.values(), grad)
		}
		if log != nil {
			log(epoch, m)
		}
	}
	return m
}
