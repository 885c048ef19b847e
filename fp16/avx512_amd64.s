//go:build !purego

#include "textflag.h"

// AVX-512 versions of the kernels in fp16_amd64.s: the same shapes, with
// blocks of 64 and 16 elements. Stores of 64 bytes are whole cache lines,
// which is what non-temporal stores want.

// bf16hi selects the high 16-bit word of each 32-bit lane of two vectors
// (VPERMT2W indices 1, 3, ..., 63): the bfloat16 halves after rounding.
DATA bf16hi<>+0(SB)/8, $0x0007000500030001
DATA bf16hi<>+8(SB)/8, $0x000f000d000b0009
DATA bf16hi<>+16(SB)/8, $0x0017001500130011
DATA bf16hi<>+24(SB)/8, $0x001f001d001b0019
DATA bf16hi<>+32(SB)/8, $0x0027002500230021
DATA bf16hi<>+40(SB)/8, $0x002f002d002b0029
DATA bf16hi<>+48(SB)/8, $0x0037003500330031
DATA bf16hi<>+56(SB)/8, $0x003f003d003b0039
GLOBL bf16hi<>(SB), RODATA|NOPTR, $64

// Z11 = 0x00400000 (quiet bit), Z12 = bf16hi, Z14 = 1, Z15 = 0x7fff.
#define BF16_CONSTS512 \
	MOVL         $0x00400000, AX; \
	VPBROADCASTD AX, Z11; \
	VMOVDQU64    bf16hi<>(SB), Z12; \
	MOVL         $1, AX; \
	VPBROADCASTD AX, Z14; \
	MOVL         $0x7fff, AX; \
	VPBROADCASTD AX, Z15

// BF16_ROUND512 sets t to x + 0x7fff + lsb, or to x | quiet where x is a
// NaN; the bfloat16 is t's high half. K1 is clobbered.
#define BF16_ROUND512(x, t) \
	VPSRLD     $16, x, t; \
	VPANDD     Z14, t, t; \
	VPADDD     Z15, t, t; \
	VPADDD     x, t, t; \
	VFPCLASSPSZ $0x81, x, K1; \
	VPORD      Z11, x, K1, t

// PREFETCH4 and PREFETCH2 fetch the source 1 KiB ahead: the hardware
// prefetchers alone leave the bfloat16 loops, which do more arithmetic per
// line, short of memory bandwidth on large vectors.
#define PREFETCH4 \
	PREFETCHT0 1024(SI); \
	PREFETCHT0 1088(SI); \
	PREFETCHT0 1152(SI); \
	PREFETCHT0 1216(SI)

#define PREFETCH2 \
	PREFETCHT0 1024(SI); \
	PREFETCHT0 1088(SI)

#define LOOPS512(CONVERT64, CONVERT16, SRCSTEP64, DSTSTEP64, SRCSTEP16, DSTSTEP16) \
	CMPQ  CX, $64; \
	JB    loop16; \
	TESTB DX, DX; \
	JNZ   stream64; \
loop64: \
	CONVERT64(VMOVDQU64); \
	ADDQ  $SRCSTEP64, SI; \
	ADDQ  $DSTSTEP64, DI; \
	SUBQ  $64, CX; \
	CMPQ  CX, $64; \
	JAE   loop64; \
	JMP   tail; \
stream64: \
	CONVERT64(VMOVNTDQ); \
	ADDQ  $SRCSTEP64, SI; \
	ADDQ  $DSTSTEP64, DI; \
	SUBQ  $64, CX; \
	CMPQ  CX, $64; \
	JAE   stream64; \
	SFENCE; \
tail: \
	TESTQ CX, CX; \
	JZ    done; \
loop16: \
	CONVERT16; \
	ADDQ  $SRCSTEP16, SI; \
	ADDQ  $DSTSTEP16, DI; \
	SUBQ  $16, CX; \
	JNZ   loop16; \
done: \
	VZEROUPPER; \
	RET

// HALF_STORE64 rounds Z0..Z3 to half precision and stores 64 results at m.
#define HALF_STORE64(STORE, m0, m1) \
	VCVTPS2PH    $0, Z0, Y0; \
	VCVTPS2PH    $0, Z1, Y1; \
	VCVTPS2PH    $0, Z2, Y2; \
	VCVTPS2PH    $0, Z3, Y3; \
	VINSERTI64X4 $1, Y1, Z0, Z0; \
	VINSERTI64X4 $1, Y3, Z2, Z2; \
	STORE        Z0, m0; \
	STORE        Z2, m1

#define F32_TO_HALF64(STORE) \
	PREFETCH4; \
	VMOVUPS 0(SI), Z0; \
	VMOVUPS 64(SI), Z1; \
	VMOVUPS 128(SI), Z2; \
	VMOVUPS 192(SI), Z3; \
	HALF_STORE64(STORE, 0(DI), 64(DI))

#define F32_TO_HALF16 \
	VMOVUPS   (SI), Z0; \
	VCVTPS2PH $0, Z0, Y0; \
	VMOVDQU   Y0, (DI)

// func f32ToHalfAVX512(dst *uint16, src *float32, n int, stream bool)
TEXT ·f32ToHalfAVX512(SB), NOSPLIT, $0-25
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVB stream+24(FP), DX
	LOOPS512(F32_TO_HALF64, F32_TO_HALF16, 256, 128, 64, 32)

#define SCALE_TO_HALF64(STORE) \
	PREFETCH4; \
	VMULPS 0(SI), Z10, Z0; \
	VMULPS 64(SI), Z10, Z1; \
	VMULPS 128(SI), Z10, Z2; \
	VMULPS 192(SI), Z10, Z3; \
	HALF_STORE64(STORE, 0(DI), 64(DI))

#define SCALE_TO_HALF16 \
	VMULPS    (SI), Z10, Z0; \
	VCVTPS2PH $0, Z0, Y0; \
	VMOVDQU   Y0, (DI)

// func scaleToHalfAVX512(dst *uint16, src *float32, n int, scale float32, stream bool)
TEXT ·scaleToHalfAVX512(SB), NOSPLIT, $0-29
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS scale+24(FP), Z10
	MOVB         stream+28(FP), DX
	LOOPS512(SCALE_TO_HALF64, SCALE_TO_HALF16, 256, 128, 64, 32)

#define HALF_TO_F32_64(STORE) \
	PREFETCH2; \
	VCVTPH2PS 0(SI), Z0; \
	VCVTPH2PS 32(SI), Z1; \
	VCVTPH2PS 64(SI), Z2; \
	VCVTPH2PS 96(SI), Z3; \
	STORE     Z0, 0(DI); \
	STORE     Z1, 64(DI); \
	STORE     Z2, 128(DI); \
	STORE     Z3, 192(DI)

#define HALF_TO_F32_16 \
	VCVTPH2PS (SI), Z0; \
	VMOVUPS   Z0, (DI)

// func halfToF32AVX512(dst *float32, src *uint16, n int, stream bool)
TEXT ·halfToF32AVX512(SB), NOSPLIT, $0-25
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVB stream+24(FP), DX
	LOOPS512(HALF_TO_F32_64, HALF_TO_F32_16, 128, 256, 32, 64)

// BF16_STORE64 rounds Z0..Z3 to bfloat16 and stores 64 results at m.
#define BF16_STORE64(STORE, m0, m1) \
	BF16_ROUND512(Z0, Z4); \
	BF16_ROUND512(Z1, Z5); \
	BF16_ROUND512(Z2, Z6); \
	BF16_ROUND512(Z3, Z7); \
	VPERMT2W Z5, Z12, Z4; \
	VPERMT2W Z7, Z12, Z6; \
	STORE    Z4, m0; \
	STORE    Z6, m1

// BF16_STORE16 rounds Z0 to bfloat16 and stores 16 results at m.
#define BF16_STORE16(m) \
	BF16_ROUND512(Z0, Z4); \
	VPERMT2W Z4, Z12, Z4; \
	VMOVDQU  Y4, m

#define F32_TO_BF16_64(STORE) \
	PREFETCH4; \
	VMOVUPS 0(SI), Z0; \
	VMOVUPS 64(SI), Z1; \
	VMOVUPS 128(SI), Z2; \
	VMOVUPS 192(SI), Z3; \
	BF16_STORE64(STORE, 0(DI), 64(DI))

#define F32_TO_BF16_16 \
	VMOVUPS (SI), Z0; \
	BF16_STORE16((DI))

// func f32ToBF16AVX512(dst *uint16, src *float32, n int, stream bool)
TEXT ·f32ToBF16AVX512(SB), NOSPLIT, $0-25
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVB stream+24(FP), DX
	BF16_CONSTS512
	LOOPS512(F32_TO_BF16_64, F32_TO_BF16_16, 256, 128, 64, 32)

#define SCALE_TO_BF16_64(STORE) \
	PREFETCH4; \
	VMULPS 0(SI), Z10, Z0; \
	VMULPS 64(SI), Z10, Z1; \
	VMULPS 128(SI), Z10, Z2; \
	VMULPS 192(SI), Z10, Z3; \
	BF16_STORE64(STORE, 0(DI), 64(DI))

#define SCALE_TO_BF16_16 \
	VMULPS (SI), Z10, Z0; \
	BF16_STORE16((DI))

// func scaleToBF16AVX512(dst *uint16, src *float32, n int, scale float32, stream bool)
TEXT ·scaleToBF16AVX512(SB), NOSPLIT, $0-29
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS scale+24(FP), Z10
	MOVB         stream+28(FP), DX
	BF16_CONSTS512
	LOOPS512(SCALE_TO_BF16_64, SCALE_TO_BF16_16, 256, 128, 64, 32)

// BF16_LOAD512 widens sixteen bfloat16 at m into the float32 lanes of z.
#define BF16_LOAD512(m, z) \
	VPMOVZXWD m, z; \
	VPSLLD    $16, z, z

#define BF16_TO_F32_64(STORE) \
	PREFETCH2; \
	BF16_LOAD512(0(SI), Z0); \
	BF16_LOAD512(32(SI), Z1); \
	BF16_LOAD512(64(SI), Z2); \
	BF16_LOAD512(96(SI), Z3); \
	STORE Z0, 0(DI); \
	STORE Z1, 64(DI); \
	STORE Z2, 128(DI); \
	STORE Z3, 192(DI)

#define BF16_TO_F32_16 \
	BF16_LOAD512((SI), Z0); \
	VMOVDQU64 Z0, (DI)

// func bf16ToF32AVX512(dst *float32, src *uint16, n int, stream bool)
TEXT ·bf16ToF32AVX512(SB), NOSPLIT, $0-25
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVB stream+24(FP), DX
	LOOPS512(BF16_TO_F32_64, BF16_TO_F32_16, 128, 256, 32, 64)

// The sums, as in fp16_amd64.s: elements lo..hi-1 (index BX) in blocks of
// 64, then 16. R9 holds srcs[0]'s base, R10 walks the slice headers, R11
// counts the sources left to add.

// SUMS512(LOAD, STORE64, STORE16) is the body of a sum kernel: LOAD(m, z)
// widens 16 values at m into z; STORE64 and STORE16 round and store Z0..Z3
// or Z0.
#define SUMS512(LOAD, STORE64, STORE16) \
	MOVQ  (SI), R9; \
loop64: \
	LEAQ  64(BX), AX; \
	CMPQ  AX, DX; \
	JA    loop16; \
	PREFETCHT0 1024(R9)(BX*2); \
	PREFETCHT0 1088(R9)(BX*2); \
	LOAD(0(R9)(BX*2), Z0); \
	LOAD(32(R9)(BX*2), Z1); \
	LOAD(64(R9)(BX*2), Z2); \
	LOAD(96(R9)(BX*2), Z3); \
	LEAQ  24(SI), R10; \
	LEAQ  -1(R8), R11; \
	TESTQ R11, R11; \
	JZ    store64; \
add64: \
	MOVQ  (R10), R12; \
	PREFETCHT0 1024(R12)(BX*2); \
	PREFETCHT0 1088(R12)(BX*2); \
	LOAD(0(R12)(BX*2), Z4); \
	LOAD(32(R12)(BX*2), Z5); \
	LOAD(64(R12)(BX*2), Z6); \
	LOAD(96(R12)(BX*2), Z7); \
	VADDPS Z4, Z0, Z0; \
	VADDPS Z5, Z1, Z1; \
	VADDPS Z6, Z2, Z2; \
	VADDPS Z7, Z3, Z3; \
	ADDQ  $24, R10; \
	DECQ  R11; \
	JNZ   add64; \
store64: \
	VMULPS Z10, Z0, Z0; \
	VMULPS Z10, Z1, Z1; \
	VMULPS Z10, Z2, Z2; \
	VMULPS Z10, Z3, Z3; \
	STORE64(VMOVDQU64, 0(DI)(BX*2), 64(DI)(BX*2)); \
	MOVQ  AX, BX; \
	JMP   loop64; \
loop16: \
	CMPQ  BX, DX; \
	JAE   done; \
	LOAD((R9)(BX*2), Z0); \
	LEAQ  24(SI), R10; \
	LEAQ  -1(R8), R11; \
	TESTQ R11, R11; \
	JZ    store16; \
add16: \
	MOVQ  (R10), R12; \
	LOAD((R12)(BX*2), Z4); \
	VADDPS Z4, Z0, Z0; \
	ADDQ  $24, R10; \
	DECQ  R11; \
	JNZ   add16; \
store16: \
	VMULPS Z10, Z0, Z0; \
	STORE16((DI)(BX*2)); \
	ADDQ  $16, BX; \
	JMP   loop16; \
done: \
	VZEROUPPER; \
	RET

#define HALF_LOAD512(m, z) VCVTPH2PS m, z

#define HALF_STORE16(m) \
	VCVTPS2PH $0, Z0, Y0; \
	VMOVDQU   Y0, m

// func sumHalfAVX512(dst *uint16, srcs *[]uint16, nsrc, lo, hi int, scale float32)
TEXT ·sumHalfAVX512(SB), NOSPLIT, $0-44
	MOVQ         dst+0(FP), DI
	MOVQ         srcs+8(FP), SI
	MOVQ         nsrc+16(FP), R8
	MOVQ         lo+24(FP), BX
	MOVQ         hi+32(FP), DX
	VBROADCASTSS scale+40(FP), Z10
	SUMS512(HALF_LOAD512, HALF_STORE64, HALF_STORE16)

// func sumBF16AVX512(dst *uint16, srcs *[]uint16, nsrc, lo, hi int, scale float32)
TEXT ·sumBF16AVX512(SB), NOSPLIT, $0-44
	MOVQ         dst+0(FP), DI
	MOVQ         srcs+8(FP), SI
	MOVQ         nsrc+16(FP), R8
	MOVQ         lo+24(FP), BX
	MOVQ         hi+32(FP), DX
	VBROADCASTSS scale+40(FP), Z10
	BF16_CONSTS512
	SUMS512(BF16_LOAD512, BF16_STORE64, BF16_STORE16)
