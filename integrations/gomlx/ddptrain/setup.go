package ddptrain

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"

	"github.com/ddpgo/ddpgo/allocator"
	"github.com/ddpgo/ddpgo/comm"
	"github.com/ddpgo/ddpgo/ddp"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
	"github.com/gomlx/gomlx/pkg/core/tensors"
	mlctx "github.com/gomlx/gomlx/pkg/ml/context"
	"github.com/gomlx/gomlx/pkg/ml/train"
)

// syncChunk is the largest piece in which the variables travel when they
// are broadcast: a block of the trainer's pool, reused for every piece.
const syncChunk = 4 << 20

// statusName names the trainer's own parameter (failure.go).
const statusName = "ddptrain/status"

// gradGraph is the gradient graph of one spec: its executor, and the
// variables it found when GoMLX built it.
type gradGraph struct {
	exec            *mlctx.Exec
	spec            any
	inputs, labels  int
	trainable       []*mlctx.Variable
	buffers         []*mlctx.Variable
	lossDType       dtypes.DType
	built, verified bool
}

// gradGraphFor returns the gradient graph for spec, making its executor
// (GoMLX builds the graph at its first execution).
func (t *Trainer) gradGraphFor(spec any, inputs, labels int) (*gradGraph, error) {
	if gg, ok := t.graphs[spec]; ok {
		if gg.inputs != inputs || gg.labels != labels {
			return nil, fmt.Errorf("%d inputs and %d labels, but the graph for spec %v was built for %d and %d",
				inputs, labels, spec, gg.inputs, gg.labels)
		}
		return gg, nil
	}
	if inputs == 0 {
		return nil, errors.New("no inputs: the model needs at least one")
	}
	gg := &gradGraph{spec: spec, inputs: inputs, labels: labels}
	exec, err := mlctx.NewExec(t.backend, t.execContext(), gg.graphFn(t))
	if err != nil {
		return nil, err
	}
	gg.exec = exec.WithName("ddptrain gradients")
	t.graphs[spec] = gg
	return gg, nil
}

// execContext is the context the executors build their graphs with. The
// variables exist by then: the first step creates them in probe graphs
// (build), with the caller's context, so GoMLX's checks of their names
// apply there.
func (t *Trainer) execContext() *mlctx.Context { return t.ctx.Checked(false) }

// graphFn builds the gradient graph, as train.Trainer builds its training
// graph up to the optimizer: the model, the loss and the losses the model
// added with train.AddLoss, then the gradient of every trainable variable
// the graph uses. It outputs the loss, then the gradients in the
// context's order of the variables.
func (gg *gradGraph) graphFn(t *Trainer) func(*mlctx.Context, []*graph.Node) []*graph.Node {
	return func(ctx *mlctx.Context, nodes []*graph.Node) []*graph.Node {
		g := nodes[0].Graph()
		ctx.SetTraining(g, true)
		predictions := t.model(ctx, gg.spec, nodes[:gg.inputs])
		if t.lossFn != nil {
			loss := t.lossFn(nodes[gg.inputs:], predictions)
			if !loss.Shape().IsScalar() {
				loss = graph.ReduceAllMean(loss)
			}
			train.SetLossNoRegularization(ctx, loss)
			train.AddLoss(ctx, loss)
		}
		loss := train.GetLosses(ctx, g)
		if loss == nil {
			panic(errors.New("no loss: the loss function is nil and the model added no term with train.AddLoss"))
		}
		gg.trainable = gg.trainable[:0]
		for v := range ctx.IterVariables() {
			if v.Trainable && v.InUseByGraph(g) {
				gg.trainable = append(gg.trainable, v)
			}
		}
		grads := ctx.BuildTrainableVariablesGradientsGraph(loss)
		train.ExecPerStepUpdateGraphFn(ctx, g)
		gg.buffers = gg.buffers[:0]
		for v := range ctx.IterVariables() {
			if !v.Trainable && v.ChangedInGraph(g) && t.isBuffer(v) {
				gg.buffers = append(gg.buffers, v)
			}
		}
		gg.lossDType = loss.DType()
		gg.built = true
		return append([]*graph.Node{loss}, grads...)
	}
}

// check verifies, once, that a graph built for another spec after the
// Reducer found the same variables as the first.
func (gg *gradGraph) check(t *Trainer) error {
	if gg.verified {
		return nil
	}
	if !gg.built {
		return errors.New("GoMLX ran the gradient graph without building it")
	}
	if !slices.Equal(gg.trainable, t.trainable) || !slices.Equal(gg.buffers, t.buffers) {
		return fmt.Errorf("the graph for spec %v uses %d trainable variables and %d buffers, the first graph %d and %d: every graph must train the same variables",
			gg.spec, len(gg.trainable), len(gg.buffers), len(t.trainable), len(t.buffers))
	}
	gg.verified = true
	return nil
}

// isBuffer applies Options.Buffers.
func (t *Trainer) isBuffer(v *mlctx.Variable) bool {
	if t.o.Buffers != nil {
		return t.o.Buffers(v)
	}
	return !isRNG(v)
}

// isRNG reports whether v is the context's random-number state, which
// every rank keeps its own.
func isRNG(v *mlctx.Variable) bool {
	return v.Scope() == mlctx.RootScope && v.Name() == mlctx.RNGStateVariableName
}

// setup is the first step's work before the step itself: every rank
// builds both graphs and initializes the variables, the ranks agree that
// all of them did (a rank that failed is named on every rank), the Reducer
// is built and rank 0's variables are broadcast.
func (t *Trainer) setup(ctx context.Context, spec any, inputs, labels []*tensors.Tensor) error {
	rank := t.c.Rank()
	pool, err := allocator.New(allocator.Options{SlabSize: syncChunk, Limit: 4 * syncChunk})
	if err != nil {
		return fmt.Errorf("ddptrain: rank %d: %w", rank, err)
	}
	t.pool = pool
	loaded := t.loadedBefore()
	loads := &countingLoader{Loader: t.ctx.Loader()}
	if loads.Loader != nil {
		t.ctx.SetLoader(loads)
	}
	built := catch(func() error { return t.build(spec, inputs, labels) })
	if loads.Loader != nil {
		t.ctx.SetLoader(loads.Loader)
	}
	if built != nil {
		built = fmt.Errorf("%w: rank %d: building the graphs: %w", ErrGraph, rank, built)
	}
	if err := t.agree(ctx, built, loaded+loads.n); err != nil {
		return err
	}
	params := make([]ddp.Param, 0, len(t.trainable)+1)
	for _, v := range t.trainable {
		params = append(params, ddp.Param{Name: v.ScopeAndName(), Shape: slices.Clone(v.Shape().Dimensions), DType: commDType(v.DType())})
	}
	t.status = len(params)
	params = append(params, ddp.Param{Name: statusName, Shape: []int{t.c.Size()}, DType: comm.Float32})
	o := t.o.Reducer
	o.Buffers = nil
	for _, v := range t.buffers {
		o.Buffers = append(o.Buffers, bufferParam(v))
	}
	r, err := ddp.New(ctx, t.c, params, o)
	if err != nil {
		return fmt.Errorf("ddptrain: rank %d: %w", rank, err)
	}
	t.r = r
	t.marked = make([]bool, len(params))
	if t.shard {
		if err := t.setupShard(ctx); err != nil {
			return err
		}
	}
	if err := t.syncVariables(ctx, 0, true); err != nil {
		return err
	}
	// The shadows take rank 0's values, the optimizer's scalars in the
	// trainer's context the caller's (a checkpoint's).
	if err := t.fillShadows(); err != nil {
		return fmt.Errorf("ddptrain: rank %d: %w", rank, err)
	}
	return nil
}

// build creates and initializes the variables of the gradient graph for
// the first spec and, unless the optimizer is sharded, of the optimizer
// graph, by building each once in a probe graph that is never compiled.
// (GoMLX's PreCompile would do it, but it donates the buffers of the
// variables the graph changes and leaves them without values.) GoMLX
// builds the graphs again at their first execution.
func (t *Trainer) build(spec any, inputs, labels []*tensors.Tensor) error {
	gg, err := t.gradGraphFor(spec, len(inputs), len(labels))
	if err != nil {
		return err
	}
	var in []shapes.Shape
	for _, x := range append(append([]*tensors.Tensor(nil), inputs...), labels...) {
		in = append(in, x.Shape())
	}
	gradFn := gg.graphFn(t)
	if err := t.probe("ddptrain gradients probe", in, func(nodes []*graph.Node) { gradFn(t.ctx, nodes) }); err != nil {
		return err
	}
	if !gg.built {
		return errors.New("the gradient graph was not built")
	}
	t.built, t.trainable, t.buffers, t.lossDType = gg, gg.trainable, gg.buffers, gg.lossDType
	if len(t.trainable) == 0 {
		return fmt.Errorf("%w: the model has no trainable variable", ErrUnsupported)
	}
	for _, v := range t.trainable {
		if commDType(v.DType()) == 0 {
			return fmt.Errorf("%w: variable %s is %s; the hand-off carries float32 and float64 gradients", ErrUnsupported, v.ScopeAndName(), v.DType())
		}
		if t.shard && v.DType() != dtypes.Float32 {
			return fmt.Errorf("%w: variable %s is %s; Options.Reducer.Shard gathers float32 variables only", ErrUnsupported, v.ScopeAndName(), v.DType())
		}
	}
	if t.shard {
		// The optimizer's state is made once the Reducer has said which
		// variables this rank owns (shard.go).
		return t.ctx.InitializeVariables(t.backend, nil)
	}
	t.stepped = make([]bool, len(t.trainable))
	t.span = make([]ddp.Part, len(t.trainable))
	for i, v := range t.trainable {
		t.stepped[i] = true
		t.span[i] = ddp.Part{Param: i, Hi: v.Shape().Size()}
	}
	t.stepWhole()
	return t.buildOptimizer(t.ctx)
}

// stepWhole makes the optimizer graph step the variables of t.stepped
// themselves.
func (t *Trainer) stepWhole() {
	for i, v := range t.trainable {
		if t.stepped[i] {
			t.stepVars = append(t.stepVars, v)
			t.stepParam = append(t.stepParam, i)
		}
	}
}

// buildOptimizer creates and initializes the optimizer's state for
// t.stepVars, variables of ctx, with a probe of the optimizer graph, and
// makes the graph's executor, with ctx, and its inputs, one for each of
// t.stepVars.
func (t *Trainer) buildOptimizer(ctx *mlctx.Context) error {
	t.input = make([]int, len(t.trainable))
	for i := range t.input {
		t.input[i] = -1
	}
	if len(t.stepVars) == 0 {
		return nil // a sharded optimizer and no variable of this rank's
	}
	before := make(map[*mlctx.Variable]bool)
	for v := range ctx.IterVariables() {
		before[v] = true
	}
	var in []shapes.Shape
	for _, v := range t.stepVars {
		in = append(in, v.Shape())
	}
	if err := t.probe("ddptrain optimizer probe", in, func(nodes []*graph.Node) { t.optimizerGraph(ctx, nodes) }); err != nil {
		return err
	}
	if err := ctx.InitializeVariables(t.backend, nil); err != nil {
		return err
	}
	t.optState = t.optState[:0]
	for v := range ctx.IterVariables() {
		if !before[v] {
			t.optState = append(t.optState, v)
		}
	}
	t.optIn = make([]*tensors.Tensor, len(t.stepVars))
	t.optArgs = t.optArgs[:0]
	for j, v := range t.stepVars {
		x := tensors.FromShape(v.Shape())
		// Where the backend shares memory with Go (simplego does), the
		// input lives in a buffer the graph reads in place: the averages
		// are copied into it once.
		if err := x.MaterializeOnDevice(t.backend, true, 0); err != nil {
			return err
		}
		t.optIn[j] = x
		t.optArgs = append(t.optArgs, x)
		if p := t.stepParam[j]; p >= 0 {
			t.input[p] = j
		}
	}
	exec, err := mlctx.NewExec(t.backend, ctx.Checked(false), t.optimizerGraph)
	if err != nil {
		return err
	}
	t.optExec = exec.WithName("ddptrain optimizer")
	return nil
}

// probe builds fn on parameters of the given shapes in a graph of its own,
// which it then discards.
func (t *Trainer) probe(name string, in []shapes.Shape, fn func([]*graph.Node)) error {
	g := graph.NewGraph(t.backend, name)
	defer g.Finalize()
	nodes := make([]*graph.Node, len(in))
	for i, s := range in {
		nodes[i] = graph.Parameter(g, fmt.Sprintf("p%d", i), s)
	}
	return catch(func() error { fn(nodes); return nil })
}

// optimizerGraph applies the optimizer to the averaged gradients, as
// GoMLX's gradient accumulation does: UpdateGraphWithGradients updates the
// trainable variables this graph uses, so it first uses every one it
// steps (t.stepVars: all of them unless the optimizer is sharded), in the
// order of the gradients, which is their context's.
func (t *Trainer) optimizerGraph(ctx *mlctx.Context, grads []*graph.Node) {
	t.optimizerGraphOf(ctx, t.stepVars, grads)
}

// optimizerGraphOf is optimizerGraph stepping vars.
func (t *Trainer) optimizerGraphOf(ctx *mlctx.Context, vars []*mlctx.Variable, grads []*graph.Node) {
	g := grads[0].Graph()
	ctx.SetTraining(g, true)
	for _, v := range vars {
		v.ValueGraph(g)
	}
	t.opt.UpdateGraphWithGradients(ctx, grads, t.lossDType)
}

// agree tells every rank whether every rank built its graphs (built is
// this rank's failure, or nil), holds the same variables and loaded them
// in a way the first step keeps (loaded counts the variables this rank
// held or loaded before it), with one all-gather of each rank's flag,
// fingerprint and count: a rank that failed, whose variables differ from
// rank 0's, or that loaded variables that rank 0's would replace, is named
// on every rank, and none goes on to build a Reducer its peers would wait
// in.
func (t *Trainer) agree(ctx context.Context, built error, loaded int) error {
	rank, size := t.c.Rank(), t.c.Size()
	const words = 4 // failed, fingerprint's high and low halves, loaded
	send, err := t.pool.Get(8 * words)
	if err != nil {
		return errors.Join(built, fmt.Errorf("ddptrain: rank %d: %w", rank, err))
	}
	recv, err := t.pool.Get(8 * words * size)
	if err != nil {
		return errors.Join(built, fmt.Errorf("ddptrain: rank %d: %w", rank, err), t.pool.Put(send))
	}
	mine := comm.HostBuffer(send.Addr(), words, comm.Int64)
	all := comm.HostBuffer(recv.Addr(), words*size, comm.Int64)
	fp := uint64(0)
	if built == nil {
		fp = t.fingerprint()
	} else {
		mine.AsInt64()[0] = 1
	}
	mine.AsInt64()[1], mine.AsInt64()[2] = int64(fp>>32), int64(fp&(1<<32-1))
	mine.AsInt64()[3] = int64(loaded)
	if err := t.collective(ctx, "agreeing that every rank built its graphs", t.c.AllGather(mine, all)); err != nil {
		return errors.Join(built, err)
	}
	var failed, differ, loaders []int
	v := all.AsInt64()
	for r := range size {
		if v[words*r] != 0 {
			failed = append(failed, r)
			continue
		}
		if v[words*r+1] != v[1] || v[words*r+2] != v[2] {
			differ = append(differ, r)
		}
		if v[words*r+3] != 0 {
			loaders = append(loaders, r)
		}
	}
	err = errors.Join(t.pool.Put(send), t.pool.Put(recv))
	switch {
	case built != nil:
		if len(failed) > 1 {
			built = fmt.Errorf("%w (%s failed)", built, rankList(failed))
		}
		return errors.Join(built, err)
	case len(failed) > 0:
		return errors.Join(fmt.Errorf("%w: rank %d: %s failed to build the graphs (its own error says why)", ErrPeer, rank, rankList(failed)), err)
	case t.shard && len(loaders) > 0 && len(loaders) < size:
		var not []int
		for r := range size {
			if !slices.Contains(loaders, r) {
				not = append(not, r)
			}
		}
		return errors.Join(fmt.Errorf("%w: rank %d: %s loaded variables before the first step (a checkpoint: %d on rank %d) and %s did not, "+
			"but with Options.Reducer.Shard each rank reads the optimizer state of the variables it owns from its own: load the checkpoint on every rank",
			ErrMismatch, rank, rankList(loaders), v[words*loaders[0]+3], loaders[0], rankList(not)), err)
	case len(loaders) > 0 && loaders[0] != 0:
		return errors.Join(fmt.Errorf("%w: rank %d: %s loaded variables before the first step (a checkpoint: %d on rank %d) and rank 0 did not, "+
			"but the first step gives every rank rank 0's variables, which would replace them: load the checkpoint on every rank, or on rank 0 only",
			ErrMismatch, rank, rankList(loaders), v[words*loaders[0]+3], loaders[0]), err)
	case len(differ) > 0:
		return errors.Join(fmt.Errorf("%w: rank %d: the variables of %s differ from rank 0's (this rank holds %d)", ErrMismatch, rank, rankList(differ), t.ctx.NumVariables()), err)
	}
	return err
}

// loadedBefore counts the variables but the random-number state that the
// context holds before the first step builds the graphs: loaded from a
// checkpoint at once (checkpoints.Config.Immediate), or set by the caller.
func (t *Trainer) loadedBefore() int {
	n := 0
	for v := range t.ctx.IterVariables() {
		if !isRNG(v) {
			n++
		}
	}
	return n
}

// countingLoader counts the variables but the random-number state that
// the context's Loader (a checkpoint loaded lazily, as checkpoints.Build
// does by default) gives values to while the first step builds the graphs.
type countingLoader struct {
	mlctx.Loader
	n int
}

func (l *countingLoader) LoadVariable(ctx *mlctx.Context, scope, name string) (*tensors.Tensor, bool) {
	value, found := l.Loader.LoadVariable(ctx, scope, name)
	if found && !(scope == mlctx.RootScope && name == mlctx.RNGStateVariableName) {
		l.n++
	}
	return value, found
}

// shared reports whether every rank holds variable v alike, so that the
// first step broadcasts it from rank 0: every variable but the
// random-number state and, with a sharded optimizer, the optimizer's
// state, which each rank keeps for its own variables (its scalars, which
// a rank may keep in the caller's context or mirror there, are the same
// on every rank, or loaded alike on every rank).
func (t *Trainer) shared(v *mlctx.Variable) bool {
	return !isRNG(v) && !(t.shard && (slices.Contains(t.optState, v) || t.mirrored(v)))
}

// mirrored reports whether v is the caller's copy of a scalar the
// optimizer keeps in the trainer's context.
func (t *Trainer) mirrored(v *mlctx.Variable) bool {
	for _, m := range t.mirrors {
		if m[0] == v {
			return true
		}
	}
	return false
}

// fingerprint hashes the name, dtype, shape and role of every variable
// that is broadcast, in the context's order.
func (t *Trainer) fingerprint() uint64 {
	h := fnv.New64a()
	var b [8]byte
	for v := range t.ctx.IterVariables() {
		if !t.shared(v) {
			continue
		}
		h.Write([]byte(v.ScopeAndName()))
		role := byte(0)
		if v.Trainable {
			role = 1
		}
		if slices.Contains(t.buffers, v) {
			role = 2
		}
		h.Write([]byte{0, role, byte(v.DType())})
		for _, d := range v.Shape().Dimensions {
			binary.LittleEndian.PutUint64(b[:], uint64(d))
			h.Write(b[:])
		}
	}
	return h.Sum64()
}

// syncVariables broadcasts every variable but the random-number state
// (and a sharded optimizer's state, which is each rank's own) from root,
// the trainable ones only if trainable: the bytes of all of them, in the
// context's order, through one block of the trainer's pool, a piece at a
// time. Root packs each piece before its broadcast, the others unpack it
// after.
func (t *Trainer) syncVariables(ctx context.Context, root int, trainable bool) error {
	var vars []*mlctx.Variable
	total := 0
	for v := range t.ctx.IterVariables() {
		if t.shared(v) && (trainable || !slices.Contains(t.trainable, v)) {
			vars = append(vars, v)
			total += int(v.Shape().Memory())
		}
	}
	return t.broadcastVars(ctx, root, vars, total, fmt.Sprintf("broadcasting the variables from rank %d", root))
}

// broadcastVars broadcasts total bytes from root: on root the values of
// vars laid end to end, which the other ranks unpack into their vars (nil
// on a rank that only takes part), through one block of the trainer's
// pool, a piece at a time. what names the exchange in errors.
func (t *Trainer) broadcastVars(ctx context.Context, root int, vars []*mlctx.Variable, total int, what string) error {
	rank := t.c.Rank()
	if total == 0 {
		return nil
	}
	blk, err := t.pool.Get(min(total, syncChunk))
	if err != nil {
		return fmt.Errorf("ddptrain: rank %d: %w", rank, err)
	}
	var verr error
	for sent := 0; sent < total; {
		piece := blk.Bytes()[:min(total-sent, syncChunk)]
		if rank == root {
			verr = errors.Join(verr, moveBytes(vars, sent, piece, true))
		}
		w := t.c.Broadcast(comm.HostBuffer(blk.Addr(), len(piece), comm.Uint8), root)
		if err := t.collective(ctx, what, w); err != nil {
			return err
		}
		if rank != root {
			verr = errors.Join(verr, moveBytes(vars, sent, piece, false))
		}
		sent += len(piece)
	}
	if verr != nil {
		return errors.Join(fmt.Errorf("ddptrain: rank %d: %s: %w", rank, what, verr), t.pool.Put(blk))
	}
	return t.pool.Put(blk)
}

// moveBytes copies between buf and bytes [at, at+len(buf)) of the
// variables' values laid end to end: into buf if pack, out of it if not.
func moveBytes(vars []*mlctx.Variable, at int, buf []byte, pack bool) error {
	var errs []error
	start := 0 // of the current variable
	for _, v := range vars {
		n := int(v.Shape().Memory())
		if len(buf) == 0 {
			break
		}
		if at >= start+n {
			start += n
			continue
		}
		off := at - start
		m := min(n-off, len(buf))
		value, err := v.Value()
		if err == nil && value.Shape().Memory() != v.Shape().Memory() {
			err = fmt.Errorf("value of shape %s for a variable of shape %s", value.Shape(), v.Shape())
		}
		if err == nil {
			if pack {
				err = value.ConstBytes(func(data []byte) { copy(buf[:m], data[off:off+m]) })
			} else {
				err = value.MutableBytes(func(data []byte) { copy(data[off:off+m], buf[:m]) })
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", v.ScopeAndName(), err))
		}
		buf, at, start = buf[m:], at+m, start+n
	}
	return errors.Join(errs...)
}

// collective waits for w, one of the trainer's own collectives, under
// Options.Timeout. On failure the group is aborted, since the peers may
// be waiting in it, and the pool is kept: the backend may still write the
// block.
func (t *Trainer) collective(ctx context.Context, what string, w comm.Work) error {
	ctx, cancel := context.WithTimeout(ctx, t.o.Timeout)
	defer cancel()
	if err := w.Wait(ctx); err != nil {
		err = fmt.Errorf("ddptrain: rank %d: %s: %w", t.c.Rank(), what, err)
		t.leaked = true
		t.c.Abort(err)
		return err
	}
	return nil
}

// commDType is the ddpgo dtype of a trainable variable's gradient, 0 for
// dtypes the hand-off does not carry.
func commDType(d dtypes.DType) comm.DType {
	switch d {
	case dtypes.Float32:
		return comm.Float32
	case dtypes.Float64:
		return comm.Float64
	}
	return 0
}

// bufferParam describes buffer v to the Reducer. A buffer is only ever
// broadcast, so a dtype ddpgo does not name travels as its bytes.
func bufferParam(v *mlctx.Variable) ddp.Param {
	p := ddp.Param{Name: v.ScopeAndName(), Shape: slices.Clone(v.Shape().Dimensions)}
	switch v.DType() {
	case dtypes.Float32:
		p.DType = comm.Float32
	case dtypes.Float64:
		p.DType = comm.Float64
	case dtypes.Float16:
		p.DType = comm.Float16
	case dtypes.BFloat16:
		p.DType = comm.BFloat16
	case dtypes.Int32:
		p.DType = comm.Int32
	case dtypes.Int64:
		p.DType = comm.Int64
	case dtypes.Uint8:
		p.DType = comm.Uint8
	default:
		p.DType, p.Shape = comm.Uint8, []int{int(v.Shape().Memory())}
	}
	return p
}
