package main

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
	for epoch := range cfg.Epochs {
		order := epochOrder(train.len(), cfg.Seed, epoch)
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
