//go:build !purego

#include "textflag.h"

// Rank-4 inner loops of MulQ and MulTP. As in reconstruct_amd64.s, every
// product is rounded before it is added (VMULPS then VADDPS, no FMA) and
// each sum takes its terms in the pure-Go kernel's order.

// func mulQ8AVX2(p, c, q unsafe.Pointer, m int)
// Rows 0..7 of p (8×4) = rows 0..7 of c (8×m, stride m) times q (m×4):
// each of the 32 sums starts at 0 and adds its m products in column order.
// Two rows share a register: [row i's 4 sums | row i+1's 4 sums].
TEXT ·mulQ8AVX2(SB), NOSPLIT, $0-32
	MOVQ p+0(FP), BX
	MOVQ c+8(FP), SI
	MOVQ q+16(FP), DX
	MOVQ m+24(FP), CX
	SHLQ $2, CX            // row stride in bytes
	LEAQ (SI)(CX*1), DI
	LEAQ (SI)(CX*2), R8
	LEAQ (DI)(CX*2), R9
	LEAQ (R8)(CX*2), R10
	LEAQ (R9)(CX*2), R11
	LEAQ (R10)(CX*2), R12
	LEAQ (R11)(CX*2), R13
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	XORQ AX, AX
loopq:
	CMPQ AX, CX
	JGE  doneq
	VBROADCASTF128 (DX), Y15
	VBROADCASTSS (SI)(AX*1), Y0
	VBROADCASTSS (DI)(AX*1), Y1
	VBLENDPS $0xf0, Y1, Y0, Y0
	VBROADCASTSS (R8)(AX*1), Y2
	VBROADCASTSS (R9)(AX*1), Y3
	VBLENDPS $0xf0, Y3, Y2, Y2
	VBROADCASTSS (R10)(AX*1), Y4
	VBROADCASTSS (R11)(AX*1), Y5
	VBLENDPS $0xf0, Y5, Y4, Y4
	VBROADCASTSS (R12)(AX*1), Y6
	VBROADCASTSS (R13)(AX*1), Y7
	VBLENDPS $0xf0, Y7, Y6, Y6
	VMULPS Y15, Y0, Y0
	VMULPS Y15, Y2, Y2
	VMULPS Y15, Y4, Y4
	VMULPS Y15, Y6, Y6
	VADDPS Y0, Y8, Y8
	VADDPS Y2, Y9, Y9
	VADDPS Y4, Y10, Y10
	VADDPS Y6, Y11, Y11
	ADDQ $16, DX
	ADDQ $4, AX
	JMP  loopq
doneq:
	VMOVUPS Y8, 0(BX)
	VMOVUPS Y9, 32(BX)
	VMOVUPS Y10, 64(BX)
	VMOVUPS Y11, 96(BX)
	VZEROUPPER
	RET

// Lane indexes that spread elements 0-1, 2-3, 4-5, 6-7 of a row of c over
// the two halves of a register, four copies each.
DATA spread<>+0(SB)/8, $0x0000000000000000
DATA spread<>+8(SB)/8, $0x0000000000000000
DATA spread<>+16(SB)/8, $0x0000000100000001
DATA spread<>+24(SB)/8, $0x0000000100000001
DATA spread<>+32(SB)/8, $0x0000000200000002
DATA spread<>+40(SB)/8, $0x0000000200000002
DATA spread<>+48(SB)/8, $0x0000000300000003
DATA spread<>+56(SB)/8, $0x0000000300000003
DATA spread<>+64(SB)/8, $0x0000000400000004
DATA spread<>+72(SB)/8, $0x0000000400000004
DATA spread<>+80(SB)/8, $0x0000000500000005
DATA spread<>+88(SB)/8, $0x0000000500000005
DATA spread<>+96(SB)/8, $0x0000000600000006
DATA spread<>+104(SB)/8, $0x0000000600000006
DATA spread<>+112(SB)/8, $0x0000000700000007
DATA spread<>+120(SB)/8, $0x0000000700000007
GLOBL spread<>(SB), RODATA|NOPTR, $128

// func axpy4x4AVX2(q, c, p unsafe.Pointer, m, stride int)
// q (m×4) += rows 0..3 of c (4×m, stride elements apart) times the 4-vectors p[0:4],
// p[4:8], p[8:12], p[12:16]: q[j][k] = (((q[j][k] + c0[j]*p0[k]) +
// c1[j]*p1[k]) + c2[j]*p2[k]) + c3[j]*p3[k]. m is a multiple of 8.
TEXT ·axpy4x4AVX2(SB), NOSPLIT, $0-40
	MOVQ q+0(FP), DX
	MOVQ c+8(FP), SI
	MOVQ p+16(FP), BX
	MOVQ m+24(FP), CX
	SHLQ $2, CX
	MOVQ stride+32(FP), R10
	SHLQ $2, R10
	LEAQ (SI)(R10*1), DI
	LEAQ (SI)(R10*2), R8
	LEAQ (DI)(R10*2), R9
	VBROADCASTF128 0(BX), Y8
	VBROADCASTF128 16(BX), Y9
	VBROADCASTF128 32(BX), Y10
	VBROADCASTF128 48(BX), Y11
	LEAQ spread<>(SB), AX
	VMOVUPS 0(AX), Y12
	VMOVUPS 32(AX), Y13
	VMOVUPS 64(AX), Y14
	VMOVUPS 96(AX), Y15
	XORQ AX, AX
looptp:
	CMPQ AX, CX
	JGE  donetp
	VMOVUPS 0(DX), Y0
	VMOVUPS 32(DX), Y1
	VMOVUPS 64(DX), Y2
	VMOVUPS 96(DX), Y3

	VMOVUPS (SI)(AX*1), Y4
	VPERMPS Y4, Y12, Y5
	VPERMPS Y4, Y13, Y6
	VMULPS Y8, Y5, Y5
	VMULPS Y8, Y6, Y6
	VADDPS Y5, Y0, Y0
	VADDPS Y6, Y1, Y1
	VPERMPS Y4, Y14, Y5
	VPERMPS Y4, Y15, Y6
	VMULPS Y8, Y5, Y5
	VMULPS Y8, Y6, Y6
	VADDPS Y5, Y2, Y2
	VADDPS Y6, Y3, Y3

	VMOVUPS (DI)(AX*1), Y4
	VPERMPS Y4, Y12, Y5
	VPERMPS Y4, Y13, Y6
	VMULPS Y9, Y5, Y5
	VMULPS Y9, Y6, Y6
	VADDPS Y5, Y0, Y0
	VADDPS Y6, Y1, Y1
	VPERMPS Y4, Y14, Y5
	VPERMPS Y4, Y15, Y6
	VMULPS Y9, Y5, Y5
	VMULPS Y9, Y6, Y6
	VADDPS Y5, Y2, Y2
	VADDPS Y6, Y3, Y3

	VMOVUPS (R8)(AX*1), Y4
	VPERMPS Y4, Y12, Y5
	VPERMPS Y4, Y13, Y6
	VMULPS Y10, Y5, Y5
	VMULPS Y10, Y6, Y6
	VADDPS Y5, Y0, Y0
	VADDPS Y6, Y1, Y1
	VPERMPS Y4, Y14, Y5
	VPERMPS Y4, Y15, Y6
	VMULPS Y10, Y5, Y5
	VMULPS Y10, Y6, Y6
	VADDPS Y5, Y2, Y2
	VADDPS Y6, Y3, Y3

	VMOVUPS (R9)(AX*1), Y4
	VPERMPS Y4, Y12, Y5
	VPERMPS Y4, Y13, Y6
	VMULPS Y11, Y5, Y5
	VMULPS Y11, Y6, Y6
	VADDPS Y5, Y0, Y0
	VADDPS Y6, Y1, Y1
	VPERMPS Y4, Y14, Y5
	VPERMPS Y4, Y15, Y6
	VMULPS Y11, Y5, Y5
	VMULPS Y11, Y6, Y6
	VADDPS Y5, Y2, Y2
	VADDPS Y6, Y3, Y3

	VMOVUPS Y0, 0(DX)
	VMOVUPS Y1, 32(DX)
	VMOVUPS Y2, 64(DX)
	VMOVUPS Y3, 96(DX)
	ADDQ $128, DX
	ADDQ $32, AX
	JMP  looptp
donetp:
	VZEROUPPER
	RET
