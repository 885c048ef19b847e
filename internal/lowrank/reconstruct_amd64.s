//go:build !purego

#include "textflag.h"

// The products are rounded to float32 before they are added (VMULPS then
// VADDPS, never FMA), in the order of the pure-Go kernel, so the bits are
// the same. With e, each block of c is loaded before the product is stored
// over it, and e gets the old block minus the product.

// func recon4AVX2(c, e, qt unsafe.Pointer, n int, p *float32)
TEXT ·recon4AVX2(SB), NOSPLIT, $0-40
	MOVQ c+0(FP), DI
	MOVQ e+8(FP), SI
	MOVQ qt+16(FP), DX
	MOVQ n+24(FP), CX
	MOVQ p+32(FP), AX
	VBROADCASTSS 0(AX), Y8
	VBROADCASTSS 4(AX), Y9
	VBROADCASTSS 8(AX), Y10
	VBROADCASTSS 12(AX), Y11
	TESTQ SI, SI
	JEQ  plain4
loop4:
	CMPQ CX, $8
	JLT  done4
	VMULPS 0(DX), Y8, Y0
	VMULPS 2048(DX), Y9, Y1
	VMULPS 4096(DX), Y10, Y2
	VMULPS 6144(DX), Y11, Y3
	VADDPS Y1, Y0, Y0
	VADDPS Y2, Y0, Y0
	VADDPS Y3, Y0, Y0
	VMOVUPS 0(DI), Y4
	VSUBPS Y0, Y4, Y4
	VMOVUPS Y0, 0(DI)
	VMOVUPS Y4, 0(SI)
	ADDQ $32, DX
	ADDQ $32, DI
	ADDQ $32, SI
	SUBQ $8, CX
	JMP  loop4
plain4:
	CMPQ CX, $8
	JLT  done4
	VMULPS 0(DX), Y8, Y0
	VMULPS 2048(DX), Y9, Y1
	VMULPS 4096(DX), Y10, Y2
	VMULPS 6144(DX), Y11, Y3
	VADDPS Y1, Y0, Y0
	VADDPS Y2, Y0, Y0
	VADDPS Y3, Y0, Y0
	VMOVUPS Y0, 0(DI)
	ADDQ $32, DX
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  plain4
done4:
	VZEROUPPER
	RET

// func recon1AVX2(c, e, q unsafe.Pointer, n int, s float32)
TEXT ·recon1AVX2(SB), NOSPLIT, $0-36
	MOVQ c+0(FP), DI
	MOVQ e+8(FP), SI
	MOVQ q+16(FP), DX
	MOVQ n+24(FP), CX
	VBROADCASTSS s+32(FP), Y8
	TESTQ SI, SI
	JEQ  plain1
loop1:
	CMPQ CX, $8
	JLT  done1
	VMULPS 0(DX), Y8, Y0
	VMOVUPS 0(DI), Y4
	VSUBPS Y0, Y4, Y4
	VMOVUPS Y0, 0(DI)
	VMOVUPS Y4, 0(SI)
	ADDQ $32, DX
	ADDQ $32, DI
	ADDQ $32, SI
	SUBQ $8, CX
	JMP  loop1
plain1:
	CMPQ CX, $8
	JLT  done1
	VMULPS 0(DX), Y8, Y0
	VMOVUPS Y0, 0(DI)
	ADDQ $32, DX
	ADDQ $32, DI
	SUBQ $8, CX
	JMP  plain1
done1:
	VZEROUPPER
	RET
