//go:build !purego

#include "textflag.h"

// Register conventions for the bfloat16 rounding: Y11 = 0x00400000 (the
// float32 quiet bit), Y12 = 0x7f800000 (Inf), Y13 = 0x7fffffff (magnitude
// mask), Y14 = 1, Y15 = 0x7fff (rounding bias), all per 32-bit lane.
#define BF16_CONSTS \
	MOVL $0x00400000, AX; VMOVD AX, X11; VPBROADCASTD X11, Y11; \
	MOVL $0x7f800000, AX; VMOVD AX, X12; VPBROADCASTD X12, Y12; \
	MOVL $0x7fffffff, AX; VMOVD AX, X13; VPBROADCASTD X13, Y13; \
	MOVL $1, AX; VMOVD AX, X14; VPBROADCASTD X14, Y14; \
	MOVL $0x7fff, AX; VMOVD AX, X15; VPBROADCASTD X15, Y15

// BF16_ROUND turns the eight float32 in x into eight bfloat16 in the low
// halves of x's lanes: (x + 0x7fff + lsb) >> 16, or (x | quiet) >> 16 for a
// NaN. t and u are clobbered.
#define BF16_ROUND(x, t, u) \
	VPSRLD $16, x, t; \
	VPAND Y14, t, t; \
	VPADDD Y15, t, t; \
	VPADDD x, t, t; \
	VPAND Y13, x, u; \
	VPCMPGTD Y12, u, u; \
	VPOR Y11, x, x; \
	VPBLENDVB u, x, t, x; \
	VPSRLD $16, x, x

// BF16_PACK16 stores the bfloat16 lanes of a (elements 0..7) and b (8..15)
// as 16 uint16 at dst.
#define BF16_PACK16(a, b, dst) \
	VPACKUSDW b, a, a; \
	VPERMQ $0xd8, a, a; \
	VMOVDQU a, dst

// BF16_PACK8 stores the bfloat16 lanes of Ya as 8 uint16 at dst.
#define BF16_PACK8(Ya, Xa, Xt, dst) \
	VEXTRACTI128 $1, Ya, Xt; \
	VPACKUSDW Xt, Xa, Xa; \
	VMOVDQU Xa, dst

// The conversions below share one shape: a loop over blocks of 32
// elements, in one of two copies, then a loop over blocks of 8. When stream
// is set (the caller has aligned dst to 64 bytes) the 32-element loop stores
// with non-temporal hints: a large destination then goes to memory without
// first being read into the cache, and without evicting the source.
//
// CONVERT(STORE) is a macro that converts 32 elements from SI to DI using
// STORE for the 32-byte stores; it does not advance the pointers.

// PREFETCH2 and PREFETCH1 fetch the source 1 KiB ahead (see avx512_amd64.s).
#define PREFETCH2 \
	PREFETCHT0 1024(SI); \
	PREFETCHT0 1088(SI)

#define PREFETCH1 \
	PREFETCHT0 1024(SI)

#define LOOPS(CONVERT32, CONVERT8, SRCSTEP32, DSTSTEP32, SRCSTEP8, DSTSTEP8) \
	CMPQ  CX, $32; \
	JB    loop8; \
	TESTB DX, DX; \
	JNZ   stream32; \
loop32: \
	CONVERT32(VMOVDQU); \
	ADDQ  $SRCSTEP32, SI; \
	ADDQ  $DSTSTEP32, DI; \
	SUBQ  $32, CX; \
	CMPQ  CX, $32; \
	JAE   loop32; \
	JMP   tail; \
stream32: \
	CONVERT32(VMOVNTDQ); \
	ADDQ  $SRCSTEP32, SI; \
	ADDQ  $DSTSTEP32, DI; \
	SUBQ  $32, CX; \
	CMPQ  CX, $32; \
	JAE   stream32; \
	SFENCE; \
tail: \
	TESTQ CX, CX; \
	JZ    done; \
loop8: \
	CONVERT8; \
	ADDQ  $SRCSTEP8, SI; \
	ADDQ  $DSTSTEP8, DI; \
	SUBQ  $8, CX; \
	JNZ   loop8; \
done: \
	VZEROUPPER; \
	RET

// HALF_STORE32 rounds Y0..Y3 to half precision and stores the 32 results.
#define HALF_STORE32(STORE) \
	VCVTPS2PH   $0, Y0, X0; \
	VCVTPS2PH   $0, Y1, X1; \
	VCVTPS2PH   $0, Y2, X2; \
	VCVTPS2PH   $0, Y3, X3; \
	VINSERTI128 $1, X1, Y0, Y0; \
	VINSERTI128 $1, X3, Y2, Y2; \
	STORE       Y0, 0(DI); \
	STORE       Y2, 32(DI)

#define F32_TO_HALF32(STORE) \
	PREFETCH2; \
	VMOVUPS 0(SI), Y0; \
	VMOVUPS 32(SI), Y1; \
	VMOVUPS 64(SI), Y2; \
	VMOVUPS 96(SI), Y3; \
	HALF_STORE32(STORE)

#define F32_TO_HALF8 \
	VMOVUPS   (SI), Y0; \
	VCVTPS2PH $0, Y0, X0; \
	VMOVDQU   X0, (DI)

// func f32ToHalfAVX2(dst *uint16, src *float32, n int, stream bool)
TEXT ·f32ToHalfAVX2(SB), NOSPLIT, $0-25
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVB stream+24(FP), DX
	LOOPS(F32_TO_HALF32, F32_TO_HALF8, 128, 64, 32, 16)

#define SCALE_TO_HALF32(STORE) \
	PREFETCH2; \
	VMULPS 0(SI), Y10, Y0; \
	VMULPS 32(SI), Y10, Y1; \
	VMULPS 64(SI), Y10, Y2; \
	VMULPS 96(SI), Y10, Y3; \
	HALF_STORE32(STORE)

#define SCALE_TO_HALF8 \
	VMULPS    (SI), Y10, Y0; \
	VCVTPS2PH $0, Y0, X0; \
	VMOVDQU   X0, (DI)

// func scaleToHalfAVX2(dst *uint16, src *float32, n int, scale float32, stream bool)
TEXT ·scaleToHalfAVX2(SB), NOSPLIT, $0-29
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS scale+24(FP), Y10
	MOVB         stream+28(FP), DX
	LOOPS(SCALE_TO_HALF32, SCALE_TO_HALF8, 128, 64, 32, 16)

#define HALF_TO_F32_32(STORE) \
	PREFETCH1; \
	VCVTPH2PS 0(SI), Y0; \
	VCVTPH2PS 16(SI), Y1; \
	VCVTPH2PS 32(SI), Y2; \
	VCVTPH2PS 48(SI), Y3; \
	STORE     Y0, 0(DI); \
	STORE     Y1, 32(DI); \
	STORE     Y2, 64(DI); \
	STORE     Y3, 96(DI)

#define HALF_TO_F32_8 \
	VCVTPH2PS (SI), Y0; \
	VMOVUPS   Y0, (DI)

// func halfToF32AVX2(dst *float32, src *uint16, n int, stream bool)
TEXT ·halfToF32AVX2(SB), NOSPLIT, $0-25
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVB stream+24(FP), DX
	LOOPS(HALF_TO_F32_32, HALF_TO_F32_8, 64, 128, 16, 32)

// BF16_STORE32 rounds Y0..Y3 to bfloat16 and stores the 32 results.
#define BF16_STORE32(STORE) \
	BF16_ROUND(Y0, Y4, Y5); \
	BF16_ROUND(Y1, Y6, Y7); \
	BF16_ROUND(Y2, Y8, Y9); \
	BF16_ROUND(Y3, Y4, Y5); \
	VPACKUSDW Y1, Y0, Y0; \
	VPERMQ    $0xd8, Y0, Y0; \
	VPACKUSDW Y3, Y2, Y2; \
	VPERMQ    $0xd8, Y2, Y2; \
	STORE     Y0, 0(DI); \
	STORE     Y2, 32(DI)

#define F32_TO_BF16_32(STORE) \
	PREFETCH2; \
	VMOVDQU 0(SI), Y0; \
	VMOVDQU 32(SI), Y1; \
	VMOVDQU 64(SI), Y2; \
	VMOVDQU 96(SI), Y3; \
	BF16_STORE32(STORE)

#define F32_TO_BF16_8 \
	VMOVDQU (SI), Y0; \
	BF16_ROUND(Y0, Y4, Y5); \
	BF16_PACK8(Y0, X0, X1, (DI))

// func f32ToBF16AVX2(dst *uint16, src *float32, n int, stream bool)
TEXT ·f32ToBF16AVX2(SB), NOSPLIT, $0-25
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVB stream+24(FP), DX
	BF16_CONSTS
	LOOPS(F32_TO_BF16_32, F32_TO_BF16_8, 128, 64, 32, 16)

#define SCALE_TO_BF16_32(STORE) \
	PREFETCH2; \
	VMULPS 0(SI), Y10, Y0; \
	VMULPS 32(SI), Y10, Y1; \
	VMULPS 64(SI), Y10, Y2; \
	VMULPS 96(SI), Y10, Y3; \
	BF16_STORE32(STORE)

#define SCALE_TO_BF16_8 \
	VMULPS (SI), Y10, Y0; \
	BF16_ROUND(Y0, Y4, Y5); \
	BF16_PACK8(Y0, X0, X1, (DI))

// func scaleToBF16AVX2(dst *uint16, src *float32, n int, scale float32, stream bool)
TEXT ·scaleToBF16AVX2(SB), NOSPLIT, $0-29
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS scale+24(FP), Y10
	MOVB         stream+28(FP), DX
	BF16_CONSTS
	LOOPS(SCALE_TO_BF16_32, SCALE_TO_BF16_8, 128, 64, 32, 16)

#define BF16_TO_F32_32(STORE) \
	PREFETCH1; \
	VPMOVZXWD 0(SI), Y0; \
	VPMOVZXWD 16(SI), Y1; \
	VPMOVZXWD 32(SI), Y2; \
	VPMOVZXWD 48(SI), Y3; \
	VPSLLD    $16, Y0, Y0; \
	VPSLLD    $16, Y1, Y1; \
	VPSLLD    $16, Y2, Y2; \
	VPSLLD    $16, Y3, Y3; \
	STORE     Y0, 0(DI); \
	STORE     Y1, 32(DI); \
	STORE     Y2, 64(DI); \
	STORE     Y3, 96(DI)

#define BF16_TO_F32_8 \
	VPMOVZXWD (SI), Y0; \
	VPSLLD    $16, Y0, Y0; \
	VMOVDQU   Y0, (DI)

// func bf16ToF32AVX2(dst *float32, src *uint16, n int, stream bool)
TEXT ·bf16ToF32AVX2(SB), NOSPLIT, $0-25
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	MOVB stream+24(FP), DX
	LOOPS(BF16_TO_F32_32, BF16_TO_F32_8, 64, 128, 16, 32)

// The sums walk elements lo..hi-1 (index BX) in blocks of 32, then 8. For
// each block the first source is loaded, the others are added in order,
// then the block is scaled, rounded and stored. R9 holds srcs[0]'s base,
// R10 walks the slice headers (24 bytes each), R11 counts sources left.

// func sumHalfAVX2(dst *uint16, srcs *[]uint16, nsrc, lo, hi int, scale float32)
TEXT ·sumHalfAVX2(SB), NOSPLIT, $0-44
	MOVQ         dst+0(FP), DI
	MOVQ         srcs+8(FP), SI
	MOVQ         nsrc+16(FP), R8
	MOVQ         lo+24(FP), BX
	MOVQ         hi+32(FP), DX
	VBROADCASTSS scale+40(FP), Y10
	MOVQ         (SI), R9

loop32:
	LEAQ      32(BX), AX
	CMPQ      AX, DX
	JA        loop8
	PREFETCHT0 1024(R9)(BX*2)
	VCVTPH2PS 0(R9)(BX*2), Y0
	VCVTPH2PS 16(R9)(BX*2), Y1
	VCVTPH2PS 32(R9)(BX*2), Y2
	VCVTPH2PS 48(R9)(BX*2), Y3
	LEAQ      24(SI), R10
	LEAQ      -1(R8), R11
	TESTQ     R11, R11
	JZ        store32

add32:
	MOVQ      (R10), R12
	PREFETCHT0 1024(R12)(BX*2)
	VCVTPH2PS 0(R12)(BX*2), Y4
	VCVTPH2PS 16(R12)(BX*2), Y5
	VCVTPH2PS 32(R12)(BX*2), Y6
	VCVTPH2PS 48(R12)(BX*2), Y7
	VADDPS    Y4, Y0, Y0
	VADDPS    Y5, Y1, Y1
	VADDPS    Y6, Y2, Y2
	VADDPS    Y7, Y3, Y3
	ADDQ      $24, R10
	DECQ      R11
	JNZ       add32

store32:
	VMULPS      Y10, Y0, Y0
	VMULPS      Y10, Y1, Y1
	VMULPS      Y10, Y2, Y2
	VMULPS      Y10, Y3, Y3
	VCVTPS2PH   $0, Y0, X0
	VCVTPS2PH   $0, Y1, X1
	VCVTPS2PH   $0, Y2, X2
	VCVTPS2PH   $0, Y3, X3
	VINSERTI128 $1, X1, Y0, Y0
	VINSERTI128 $1, X3, Y2, Y2
	VMOVDQU     Y0, 0(DI)(BX*2)
	VMOVDQU     Y2, 32(DI)(BX*2)
	MOVQ        AX, BX
	JMP         loop32

loop8:
	CMPQ      BX, DX
	JAE       done
	VCVTPH2PS (R9)(BX*2), Y0
	LEAQ      24(SI), R10
	LEAQ      -1(R8), R11
	TESTQ     R11, R11
	JZ        store8

add8:
	MOVQ      (R10), R12
	VCVTPH2PS (R12)(BX*2), Y4
	VADDPS    Y4, Y0, Y0
	ADDQ      $24, R10
	DECQ      R11
	JNZ       add8

store8:
	VMULPS    Y10, Y0, Y0
	VCVTPS2PH $0, Y0, X0
	VMOVDQU   X0, (DI)(BX*2)
	ADDQ      $8, BX
	JMP       loop8

done:
	VZEROUPPER
	RET

// BF16_LOAD widens eight bfloat16 at m into the float32 lanes of y.
#define BF16_LOAD(m, y) \
	VPMOVZXWD m, y; \
	VPSLLD $16, y, y

// func sumBF16AVX2(dst *uint16, srcs *[]uint16, nsrc, lo, hi int, scale float32)
TEXT ·sumBF16AVX2(SB), NOSPLIT, $0-44
	MOVQ         dst+0(FP), DI
	MOVQ         srcs+8(FP), SI
	MOVQ         nsrc+16(FP), R8
	MOVQ         lo+24(FP), BX
	MOVQ         hi+32(FP), DX
	VBROADCASTSS scale+40(FP), Y10
	BF16_CONSTS
	MOVQ         (SI), R9

loop32:
	LEAQ  32(BX), AX
	CMPQ  AX, DX
	JA    loop8
	PREFETCHT0 1024(R9)(BX*2)
	BF16_LOAD(0(R9)(BX*2), Y0)
	BF16_LOAD(16(R9)(BX*2), Y1)
	BF16_LOAD(32(R9)(BX*2), Y2)
	BF16_LOAD(48(R9)(BX*2), Y3)
	LEAQ  24(SI), R10
	LEAQ  -1(R8), R11
	TESTQ R11, R11
	JZ    store32

add32:
	MOVQ   (R10), R12
	PREFETCHT0 1024(R12)(BX*2)
	BF16_LOAD(0(R12)(BX*2), Y4)
	BF16_LOAD(16(R12)(BX*2), Y5)
	BF16_LOAD(32(R12)(BX*2), Y6)
	BF16_LOAD(48(R12)(BX*2), Y7)
	VADDPS Y4, Y0, Y0
	VADDPS Y5, Y1, Y1
	VADDPS Y6, Y2, Y2
	VADDPS Y7, Y3, Y3
	ADDQ   $24, R10
	DECQ   R11
	JNZ    add32

store32:
	VMULPS Y10, Y0, Y0
	VMULPS Y10, Y1, Y1
	VMULPS Y10, Y2, Y2
	VMULPS Y10, Y3, Y3
	BF16_ROUND(Y0, Y4, Y5)
	BF16_ROUND(Y1, Y6, Y7)
	BF16_ROUND(Y2, Y8, Y9)
	BF16_ROUND(Y3, Y4, Y5)
	BF16_PACK16(Y0, Y1, 0(DI)(BX*2))
	BF16_PACK16(Y2, Y3, 32(DI)(BX*2))
	MOVQ   AX, BX
	JMP    loop32

loop8:
	CMPQ  BX, DX
	JAE   done
	BF16_LOAD((R9)(BX*2), Y0)
	LEAQ  24(SI), R10
	LEAQ  -1(R8), R11
	TESTQ R11, R11
	JZ    store8

add8:
	MOVQ   (R10), R12
	BF16_LOAD((R12)(BX*2), Y4)
	VADDPS Y4, Y0, Y0
	ADDQ   $24, R10
	DECQ   R11
	JNZ    add8

store8:
	VMULPS Y10, Y0, Y0
	BF16_ROUND(Y0, Y4, Y5)
	BF16_PACK8(Y0, X0, X1, (DI)(BX*2))
	ADDQ   $8, BX
	JMP    loop8

done:
	VZEROUPPER
	RET

// func cpuid(leaf, sub uint32) (eax, ebx, ecx, edx uint32)
TEXT ·cpuid(SB), NOSPLIT, $0-24
	MOVL leaf+0(FP), AX
	MOVL sub+4(FP), CX
	CPUID
	MOVL AX, eax+8(FP)
	MOVL BX, ebx+12(FP)
	MOVL CX, ecx+16(FP)
	MOVL DX, edx+20(FP)
	RET

// func xgetbv0() (eax, edx uint32)
TEXT ·xgetbv0(SB), NOSPLIT, $0-8
	MOVL $0, CX
	XGETBV
	MOVL AX, eax+0(FP)
	MOVL DX, edx+4(FP)
	RET
