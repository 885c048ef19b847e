package allocator_test

import (
	"errors"
	"fmt"

	"github.com/ddpgo/ddpgo/allocator"
)

func Example() {
	pool, err := allocator.New(allocator.Options{Limit: 256 << 20})
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	b, err := pool.Get(1000) // 250 float32 gradients, say
	if err != nil {
		panic(err)
	}
	grads := b.Float32s()
	grads[0] = 0.5
	fmt.Println(b.Size(), uintptr(b.Addr())%allocator.Alignment, len(grads))
	if err := pool.Put(b); err != nil {
		panic(err)
	}

	_, err = pool.Get(512 << 20)
	fmt.Println(errors.Is(err, allocator.ErrExhausted))
	st := pool.Stats()
	fmt.Println(st.Gets, st.Puts, st.InUse)
	// Output:
	// 1024 0 256
	// true
	// 1 1 0
}
