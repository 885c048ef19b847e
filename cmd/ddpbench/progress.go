package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// progress draws a bar on a terminal: "label [=====>    ] 12/40 3.1s".
// It stays silent for the first couple of seconds (short runs print
// nothing), when the writer is not a terminal, and when disabled (json
// and csv output). It redraws at most 10 times a second, from its own
// goroutine, which stop ends.
type progress struct {
	w      io.Writer
	label  string
	total  int
	done   atomic.Int64
	start  time.Time
	quit   chan struct{}
	exited chan struct{}
	once   sync.Once
	mu     sync.Mutex // serializes drawing and clearing
	drawn  bool
	buf    []byte // the line being drawn, reused: drawing allocates nothing
}

// progressDelay is how long a run goes before the bar appears.
const progressDelay = 2 * time.Second

// isTerminal reports whether w is a terminal: a file whose terminal
// attributes can be read.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && haveTermios(f.Fd())
}

func newProgress(w io.Writer, label string, total int, enabled bool) *progress {
	p := &progress{w: w, label: label, total: total, start: time.Now(), quit: make(chan struct{}), exited: make(chan struct{})}
	if !enabled || !isTerminal(w) {
		close(p.exited)
		p.once.Do(func() {})
		return p
	}
	go p.loop()
	return p
}

func (p *progress) loop() {
	defer close(p.exited)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.quit:
			return
		case <-t.C:
			if time.Since(p.start) >= progressDelay {
				p.draw()
			}
		}
	}
}

// onProgress, when a test sets it, is called with the units done after
// every add: the one point where run, sweep and collective all report
// progress, which lets a test interrupt them at a known place.
var onProgress func(label string, done int64)

// onBackward, when a test sets it, is called by each rank as the
// simulated backward of a step of ddpbench run starts (bench's
// Config.OnBackward).
var onBackward func()

// add counts n more units done.
func (p *progress) add(n int) {
	d := p.done.Add(int64(n))
	if onProgress != nil {
		onProgress(p.label, d)
	}
}

// draw redraws the bar. It allocates nothing once its buffer has grown,
// because it runs during the measured steps, whose allocations ddpbench
// counts for the whole process.
func (p *progress) draw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf = append(p.buf[:0], '\r')
	p.buf = appendBar(p.buf, p.label, int(p.done.Load()), p.total, time.Since(p.start), 30)
	p.w.Write(p.buf)
	p.drawn = true
}

// clear erases the bar so that other output starts on a clean line; the
// next tick draws it again.
func (p *progress) clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
		p.drawn = false
	}
}

// above erases the bar and runs print, which writes output that must not
// share a line with the bar, while holding the lock that drawing takes,
// so that no redraw lands between the erase and the output.
func (p *progress) above(print func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
		p.drawn = false
	}
	print()
}

// stop ends the bar and erases it. It is idempotent.
func (p *progress) stop() {
	p.once.Do(func() { close(p.quit) })
	<-p.exited
	p.clear()
}

// renderBar returns the text of a bar width characters wide.
func renderBar(label string, done, total int, elapsed time.Duration, width int) string {
	return string(appendBar(nil, label, done, total, elapsed, width))
}

// appendBar appends the text of a bar width characters wide to dst:
// "label [=====>    ] 12/40 3.1s".
func appendBar(dst []byte, label string, done, total int, elapsed time.Duration, width int) []byte {
	done = min(max(done, 0), total)
	fill := 0
	if total > 0 {
		fill = done * width / total
	}
	dst = append(dst, label...)
	dst = append(dst, " ["...)
	for i := range width {
		switch {
		case i < fill:
			dst = append(dst, '=')
		case i == fill:
			dst = append(dst, '>')
		default:
			dst = append(dst, ' ')
		}
	}
	dst = append(dst, "] "...)
	dst = strconv.AppendInt(dst, int64(done), 10)
	dst = append(dst, '/')
	dst = strconv.AppendInt(dst, int64(total), 10)
	dst = append(dst, ' ')
	dst = strconv.AppendFloat(dst, elapsed.Seconds(), 'f', 1, 64)
	return append(dst, 's')
}
