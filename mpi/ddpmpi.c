//go:build mpi

#include "ddpmpi.h"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <immintrin.h>

static MPI_Op op_f16_sum, op_bf16_sum, op_half_max, op_half_min;
static MPI_Op op_f32_avg2, op_f64_avg2, op_f16_avg2, op_bf16_avg2;

static MPI_Request reqs[DDP_MAXREQ];
static MPI_Datatype req_type[DDP_MAXREQ];
static int req_recv[DDP_MAXREQ];
static MPI_Status stats[DDP_MAXREQ];
int ddp_done[DDP_MAXREQ];
int ddp_errs[DDP_MAXREQ];
int ddp_got[DDP_MAXREQ];

// A non-null address for empty buffers: Open MPI rejects a null buffer in
// some argument checks even when the count is zero.
static char empty[64];

// ---- 16-bit floats ------------------------------------------------------
//
// A sum of two binary16 (or bfloat16) elements is computed in float32 and
// rounded once to nearest even, as package fp16 and the inproc backend do.

static inline float half_to_float(uint16_t h) {
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t a = h & 0x7fff;
	uint32_t u;
	if (a >= 0x7c00) { // Inf or NaN; a NaN is made quiet
		u = 0x7f800000 | a << 13;
		if (a > 0x7c00)
			u |= 0x00400000;
	} else if (a < 0x0400) { // zero or subnormal: a * 2^-24, exact
		float f = (float)a * 0x1p-24f;
		memcpy(&u, &f, 4);
	} else { // normal: rebias the exponent from 15 to 127
		u = (a + (112 << 10)) << 13;
	}
	u |= sign;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

// round_shift returns x / 2^s rounded to nearest, ties to even (1 <= s < 32).
static inline uint32_t round_shift(uint32_t x, uint32_t s) {
	uint32_t q = x >> s, rem = x & ((1u << s) - 1), half = 1u << (s - 1);
	if (rem > half || (rem == half && (q & 1)))
		q++;
	return q;
}

static inline uint16_t float_to_half(float f) {
	uint32_t u;
	memcpy(&u, &f, 4);
	uint16_t sign = (uint16_t)(u >> 16) & 0x8000;
	uint32_t a = u & 0x7fffffff;
	if (a > 0x7f800000) // NaN: quiet, the top payload bits kept
		return sign | 0x7e00 | (uint16_t)((a >> 13) & 0x3ff);
	if (a >= 0x477ff000) // halfway between 65504 and 2^16, and up: Inf
		return sign | 0x7c00;
	if (a >= 0x38800000) // a normal half; a mantissa carry bumps the exponent
		return sign | (uint16_t)round_shift(a - (112u << 23), 13);
	if (a < 0x33000000) // below 2^-25: zero
		return sign;
	uint32_t e = a >> 23, m = (a & 0x7fffff) | 0x800000;
	return sign | (uint16_t)round_shift(m, 126 - e); // subnormal, units of 2^-24
}

static inline float bf16_to_float(uint16_t b) {
	uint32_t u = (uint32_t)b << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

static inline uint16_t float_to_bf16(float f) {
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffff) > 0x7f800000) // NaN: quiet, the top payload bits kept
		return (uint16_t)(u >> 16) | 0x0040;
	uint32_t hi = u >> 16, lo = u & 0xffff;
	if (lo > 0x8000 || (lo == 0x8000 && (hi & 1)))
		hi++; // may carry into the exponent, up to Inf: that is the rounding
	return (uint16_t)hi;
}

// half_key orders binary16 and bfloat16 bit patterns as their values
// (both are sign-magnitude), as package internal/reduce does.
static inline uint16_t half_key(uint16_t h) {
	return (h & 0x8000) ? (uint16_t)~h : (uint16_t)(h | 0x8000);
}

static int has_f16c;

__attribute__((target("avx,f16c"))) static void f16_sum_f16c(const uint16_t *in, uint16_t *io, int n) {
	int i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(in + i)));
		__m256 b = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(io + i)));
		__m128i s = _mm256_cvtps_ph(_mm256_add_ps(a, b), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
		_mm_storeu_si128((__m128i *)(io + i), s);
	}
	for (; i < n; i++)
		io[i] = float_to_half(half_to_float(in[i]) + half_to_float(io[i]));
}

static void f16_sum(void *in, void *inout, int *len, MPI_Datatype *dt) {
	(void)dt;
	const uint16_t *a = in;
	uint16_t *b = inout;
	int n = *len;
	if (has_f16c) {
		f16_sum_f16c(a, b, n);
		return;
	}
	for (int i = 0; i < n; i++)
		b[i] = float_to_half(half_to_float(a[i]) + half_to_float(b[i]));
}

static int has_avx2;

// bf16_sum_avx2 is bf16_sum's loop 8 elements at a time: widen by a shift,
// add in float32, round to nearest even by adding 0x7fff plus the kept
// part's lowest bit (a carry is the rounding, up to Inf), NaNs made quiet
// with their top payload bits, as float_to_bf16 does.
__attribute__((target("avx2"))) static void bf16_sum_avx2(const uint16_t *in, uint16_t *io, int n) {
	const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
	const __m256i half = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), quiet = _mm256_set1_epi32(0x40);
	int i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256i a = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(in + i))), 16);
		__m256i b = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(io + i))), 16);
		__m256i u = _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b)));
		__m256i hi = _mm256_srli_epi32(u, 16);
		__m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(half, _mm256_and_si256(hi, one))), 16);
		__m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
		r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, quiet), nan);
		// Every r is below 0x10000: pack to 16 bits, then gather the two
		// 128-bit lanes' low halves.
		__m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
		_mm_storeu_si128((__m128i *)(io + i), _mm256_castsi256_si128(p));
	}
	for (; i < n; i++)
		io[i] = float_to_bf16(bf16_to_float(in[i]) + bf16_to_float(io[i]));
}

__attribute__((optimize("O3"))) static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *dt) {
	(void)dt;
	const uint16_t *a = in;
	uint16_t *b = inout;
	int n = *len;
	if (has_avx2) {
		bf16_sum_avx2(a, b, n);
		return;
	}
	for (int i = 0; i < n; i++)
		b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

__attribute__((optimize("O3"))) static void half_max(void *in, void *inout, int *len, MPI_Datatype *dt) {
	(void)dt;
	const uint16_t *a = in;
	uint16_t *b = inout;
	int n = *len;
	for (int i = 0; i < n; i++)
		if (half_key(a[i]) > half_key(b[i]))
			b[i] = a[i];
}

__attribute__((optimize("O3"))) static void half_min(void *in, void *inout, int *len, MPI_Datatype *dt) {
	(void)dt;
	const uint16_t *a = in;
	uint16_t *b = inout;
	int n = *len;
	for (int i = 0; i < n; i++)
		if (half_key(a[i]) < half_key(b[i]))
			b[i] = a[i];
}

// The pair averages: in*0.5 + inout*0.5, rounded once, as inproc's
// pre-multiplied Avg sums two contributions (halving is exact in the normal
// range, and cannot overflow). With two ranks MPI can combine the two
// contributions of an element only once (a user-defined operation has no
// identity to start from), so the result is the average; with more it
// would not be, and ddp_op never picks these.
// fp-contract=off: no fused multiply-add, which would round differently
// where a half is subnormal.
__attribute__((optimize("O3", "fp-contract=off"))) static void f32_avg2(void *in, void *inout, int *len, MPI_Datatype *dt) {
	(void)dt;
	const float *a = in;
	float *b = inout;
	int n = *len;
	for (int i = 0; i < n; i++)
		b[i] = a[i] * 0.5f + b[i] * 0.5f;
}

__attribute__((optimize("O3", "fp-contract=off"))) static void f64_avg2(void *in, void *inout, int *len, MPI_Datatype *dt) {
	(void)dt;
	const double *a = in;
	double *b = inout;
	int n = *len;
	for (int i = 0; i < n; i++)
		b[i] = a[i] * 0.5 + b[i] * 0.5;
}

__attribute__((optimize("O3", "fp-contract=off"))) static void f16_avg2(void *in, void *inout, int *len, MPI_Datatype *dt) {
	(void)dt;
	const uint16_t *a = in;
	uint16_t *b = inout;
	int n = *len;
	for (int i = 0; i < n; i++)
		b[i] = float_to_half(half_to_float(a[i]) * 0.5f + half_to_float(b[i]) * 0.5f);
}

__attribute__((optimize("O3", "fp-contract=off"))) static void bf16_avg2(void *in, void *inout, int *len, MPI_Datatype *dt) {
	(void)dt;
	const uint16_t *a = in;
	uint16_t *b = inout;
	int n = *len;
	for (int i = 0; i < n; i++)
		b[i] = float_to_bf16(bf16_to_float(a[i]) * 0.5f + bf16_to_float(b[i]) * 0.5f);
}

// ---- reductions without MPI ----------------------------------------------
//
// ddp_reduce_local is MPI_Reduce_local(in, inout, n, ddp_type(dt),
// ddp_op(op, dt)) computed here: the same arithmetic as MPI's predefined
// operations (a sum, or the larger or smaller operand) and the backend's
// own, so that shared memory reduces as MPI would, and from any thread:
// MPI_THREAD_SERIALIZED allows MPI calls on the owner thread alone.
// Integer sums wrap, as MPI's do.

#define LOCAL_LOOP(T, EXPR)                                \
	do {                                                   \
		const T *a = in;                                   \
		T *b = inout;                                      \
		for (int i = 0; i < n; i++) {                      \
			T x = a[i], y = b[i];                          \
			b[i] = (EXPR);                                 \
		}                                                  \
	} while (0)

#define LOCAL_OPS(T, SUMT)                                                         \
	do {                                                                           \
		switch (op) {                                                              \
		case DDP_MAX: LOCAL_LOOP(T, y > x ? y : x); return;                        \
		case DDP_MIN: LOCAL_LOOP(T, y < x ? y : x); return;                        \
		default: LOCAL_LOOP(T, (T)((SUMT)x + (SUMT)y)); return;                    \
		}                                                                          \
	} while (0)

__attribute__((optimize("O3", "fp-contract=off"))) void ddp_reduce_local(int dt, int op, const void *in, void *inout, int n) {
	if (n <= 0)
		return;
	if (op == DDP_AVG2) {
		void (*f)(void *, void *, int *, MPI_Datatype *) = dt == DDP_F32 ? f32_avg2 : dt == DDP_F64 ? f64_avg2 : dt == DDP_F16 ? f16_avg2 : bf16_avg2;
		f((void *)in, inout, &n, NULL);
		return;
	}
	switch (dt) {
	case DDP_F32: LOCAL_OPS(float, float);
	case DDP_F64: LOCAL_OPS(double, double);
	case DDP_I32: LOCAL_OPS(int32_t, uint32_t);
	case DDP_I64: LOCAL_OPS(int64_t, uint64_t);
	case DDP_U8: LOCAL_OPS(uint8_t, uint8_t);
	}
	void (*f)(void *, void *, int *, MPI_Datatype *) = op == DDP_MAX ? half_max : op == DDP_MIN ? half_min : dt == DDP_F16 ? f16_sum : bf16_sum;
	f((void *)in, inout, &n, NULL);
}

int ddp_has_f16c(void) {
	__builtin_cpu_init();
	return __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
}

// ---- start-up -----------------------------------------------------------

static int ddp_tune_malloc(void) {
	// The user's own setting wins.
	if (getenv("MALLOC_MMAP_THRESHOLD_") != NULL || getenv("MALLOC_TRIM_THRESHOLD_") != NULL)
		return 0;
	// Blocks up to 1 GiB come from the heap and are reused, instead of
	// being mapped and faulted in anew by every large collective; the
	// trim threshold keeps the heap's top from going back to the system
	// after each of them. A thread's own arena (a heap of at most 64 MiB)
	// maps larger blocks whatever the threshold, and the owner goroutine
	// runs on whichever thread it is on: M_ARENA_MAX would send them all
	// to the main arena, but glibc fixes its arena limit when it makes
	// its second arena, which a Go program's threads have done long
	// before; MALLOC_ARENA_MAX=1 in the environment does it at start-up.
	int ok = mallopt(M_MMAP_THRESHOLD, 1 << 30);
	ok &= mallopt(M_TRIM_THRESHOLD, 1 << 30);
	if (getenv("MALLOC_ARENA_MAX") == NULL)
		mallopt(M_ARENA_MAX, 1);
	return ok;
}

// ddp_tcp_flags is Open MPI 4's default btl_tcp_flags without "put".
static const char ddp_tcp_flags[] = "send,inplace,need-ack,need-csum,hetero-rdma";

static int open_mpi_4(void) {
	char v[MPI_MAX_LIBRARY_VERSION_STRING];
	int n = 0;
	return MPI_Get_library_version(v, &n) == MPI_SUCCESS && strncmp(v, "Open MPI v4.", 12) == 0;
}

// ddp_tune_coll turns Open MPI's dynamic rules for collectives on, so
// that ddp_dup_algorithm can choose an all-reduce algorithm for a
// communicator; with no algorithm forced and no rules file, Open MPI
// decides as it does without them.
static void ddp_tune_coll(void) {
	const char *env = getenv("DDPGO_MPI_ALLREDUCE");
	if (getenv("OMPI_MCA_coll_tuned_use_dynamic_rules") != NULL || (env != NULL && strcmp(env, "mpi") == 0) || !open_mpi_4())
		return;
	setenv("OMPI_MCA_coll_tuned_use_dynamic_rules", "1", 0);
}

// ddp_tcp_eager is the TCP transport's eager limit the backend sets: a
// segment of the segmented ring (DDP_SEGMENT) and its headers fit in one
// eager message, which needs no handshake.
static const char ddp_tcp_eager[] = "300000";

static int ddp_tune_tcp(void) {
	// Only the library this was measured with: another version may name
	// its flags differently, and MPI_Init would refuse a name it lacks.
	if (!open_mpi_4())
		return 0;
	int set = 0;
	// The user's own settings win (mpirun --mca btl_tcp_flags ... sets
	// these variables too). Without "put", the TCP transport sends a
	// large message as a pipeline of fragments instead of one emulated
	// RDMA write of the whole message, which goes into the connection
	// ahead of the handshake of the message coming the other way: that one
	// then waits for the whole of this one, and an all-reduce between two
	// hosts moves its two directions one after the other (see the package
	// docs).
	if (getenv("OMPI_MCA_btl_tcp_flags") == NULL)
		set |= setenv("OMPI_MCA_btl_tcp_flags", ddp_tcp_flags, 0) == 0;
	if (getenv("OMPI_MCA_btl_tcp_eager_limit") == NULL)
		set |= setenv("OMPI_MCA_btl_tcp_eager_limit", ddp_tcp_eager, 0) == 0;
	return set;
}

// cvar_open_n finds Open MPI's control variable name through MPI's tool
// interface (initialised by the caller), and its element count.
static int cvar_open_n(const char *name, MPI_T_cvar_handle *h, int *count) {
	int idx;
	return MPI_T_cvar_get_index(name, &idx) == MPI_SUCCESS && MPI_T_cvar_handle_alloc(idx, NULL, h, count) == MPI_SUCCESS;
}

// cvar_open is cvar_open_n for a variable of one element.
static int cvar_open(const char *name, MPI_T_cvar_handle *h) {
	int count;
	if (!cvar_open_n(name, h, &count))
		return 0;
	if (count != 1) {
		MPI_T_cvar_handle_free(h);
		return 0;
	}
	return 1;
}

// cvar_int reads a variable of one int into *v; 0 where it cannot.
static int cvar_int(const char *name, int *v) {
	MPI_T_cvar_handle h;
	if (!cvar_open(name, &h))
		return 0;
	int ok = MPI_T_cvar_read(h, v) == MPI_SUCCESS;
	MPI_T_cvar_handle_free(&h);
	return ok;
}

// cvar_set_int writes v into a variable of one int; 0 where it cannot.
static int cvar_set_int(const char *name, int v) {
	MPI_T_cvar_handle h;
	if (!cvar_open(name, &h))
		return 0;
	int ok = MPI_T_cvar_write(h, &v) == MPI_SUCCESS;
	MPI_T_cvar_handle_free(&h);
	return ok;
}

// cvar_zero reports whether a variable of one int reads 0 (Open MPI's
// own choice).
static int cvar_zero(const char *name) {
	int v = -1;
	return cvar_int(name, &v) && v == 0;
}

// ddp_read_tcp reads btl_tcp_flags and btl_tcp_eager_limit as Open MPI
// holds them, or leaves -1 where its tool interface does not have them
// (the tcp transport not opened, or another MPI).
static void ddp_read_tcp(int *flags, long long *eager) {
	int prov;
	MPI_T_cvar_handle h;
	*flags = -1;
	*eager = -1;
	if (MPI_T_init_thread(MPI_THREAD_SERIALIZED, &prov) != MPI_SUCCESS)
		return;
	if (cvar_open("btl_tcp_flags", &h)) {
		unsigned u;
		if (MPI_T_cvar_read(h, &u) == MPI_SUCCESS)
			*flags = (int)u;
		MPI_T_cvar_handle_free(&h);
	}
	if (cvar_open("btl_tcp_eager_limit", &h)) {
		unsigned long long u = 0; // a size_t, MPI_UNSIGNED_LONG or _LONG_LONG
		if (MPI_T_cvar_read(h, &u) == MPI_SUCCESS)
			*eager = (long long)u;
		MPI_T_cvar_handle_free(&h);
	}
	MPI_T_finalize();
}

int ddp_init(int *provided, int *ours, int *tuned, int *tcp, int *tcp_flags, long long *tcp_eager, int *world_rank, int *world_size) {
	int rc, flag = 0;
	has_f16c = ddp_has_f16c();
	__builtin_cpu_init();
	has_avx2 = __builtin_cpu_supports("avx2");
	MPI_Finalized(&flag);
	if (flag)
		return MPI_ERR_OTHER;
	MPI_Initialized(&flag);
	if (flag) {
		*ours = 0;
		rc = MPI_Query_thread(provided);
	} else {
		*ours = 1;
		// Before MPI starts its threads, which would take arenas of their
		// own (see ddp_tune_malloc).
		*tuned = ddp_tune_malloc();
		*tcp = ddp_tune_tcp();
		ddp_tune_coll();
		rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, provided);
	}
	if (rc != MPI_SUCCESS)
		return rc;
	// The 16-bit reductions are commutative: each application rounds
	// a + b, which equals b + a.
	if ((rc = MPI_Op_create(f16_sum, 1, &op_f16_sum)) != MPI_SUCCESS ||
	    (rc = MPI_Op_create(bf16_sum, 1, &op_bf16_sum)) != MPI_SUCCESS ||
	    (rc = MPI_Op_create(half_max, 1, &op_half_max)) != MPI_SUCCESS ||
	    (rc = MPI_Op_create(half_min, 1, &op_half_min)) != MPI_SUCCESS ||
	    (rc = MPI_Op_create(f32_avg2, 1, &op_f32_avg2)) != MPI_SUCCESS ||
	    (rc = MPI_Op_create(f64_avg2, 1, &op_f64_avg2)) != MPI_SUCCESS ||
	    (rc = MPI_Op_create(f16_avg2, 1, &op_f16_avg2)) != MPI_SUCCESS ||
	    (rc = MPI_Op_create(bf16_avg2, 1, &op_bf16_avg2)) != MPI_SUCCESS)
		return rc;
	for (int i = 0; i < DDP_MAXREQ; i++)
		reqs[i] = MPI_REQUEST_NULL;
	ddp_read_tcp(tcp_flags, tcp_eager);
	MPI_Comm_rank(MPI_COMM_WORLD, world_rank);
	MPI_Comm_size(MPI_COMM_WORLD, world_size);
	return MPI_SUCCESS;
}

int ddp_finalize(int ours) {
	MPI_Op_free(&op_f16_sum);
	MPI_Op_free(&op_bf16_sum);
	MPI_Op_free(&op_half_max);
	MPI_Op_free(&op_half_min);
	MPI_Op_free(&op_f32_avg2);
	MPI_Op_free(&op_f64_avg2);
	MPI_Op_free(&op_f16_avg2);
	MPI_Op_free(&op_bf16_avg2);
	return ours ? MPI_Finalize() : MPI_SUCCESS;
}


int ddp_dup(MPI_Comm *out, int *rank, int *size) {
	int rc = MPI_Comm_dup(MPI_COMM_WORLD, out);
	if (rc != MPI_SUCCESS)
		return rc;
	if ((rc = MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN)) != MPI_SUCCESS)
		return rc;
	MPI_Comm_rank(*out, rank);
	MPI_Comm_size(*out, size);
	return MPI_SUCCESS;
}

int ddp_free(MPI_Comm *c) { return MPI_Comm_free(c); }

int ddp_split(MPI_Comm c, int color, int key, MPI_Comm *out, int *rank, int *size) {
	int rc = MPI_Comm_split(c, color, key, out);
	if (rc != MPI_SUCCESS)
		return rc;
	if ((rc = MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN)) != MPI_SUCCESS)
		return rc;
	MPI_Comm_rank(*out, rank);
	MPI_Comm_size(*out, size);
	return MPI_SUCCESS;
}

// ---- the all-reduce algorithm between hosts -----------------------------

#define FNV_OFFSET 1469598103934665603ULL

// fnv1a continues the FNV-1a hash h over n bytes at p.
static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
	for (size_t i = 0; i < n; i++)
		h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ULL;
	return h;
}

uint64_t ddp_boot_id(void) {
	static uint64_t id;
	static int done;
	if (!done) {
		done = 1;
		char buf[64] = {0};
		FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
		if (f != NULL) {
			if (fgets(buf, sizeof buf, f) != NULL && buf[0] != 0)
				id = fnv1a(FNV_OFFSET, buf, strlen(buf)) | 1;
			fclose(f);
		}
	}
	return id;
}

// host_key names this process's host, hashed (FNV-1a): DDPGO_MPI_HOST
// where set, else the host's name, boot id (machines may share a name)
// and network namespace (the test hosts of scripts/netlab.sh share a
// machine).
static uint64_t host_key(void) {
	const char *env = getenv("DDPGO_MPI_HOST");
	if (env != NULL && *env != 0)
		return fnv1a(FNV_OFFSET, env, strlen(env));
	char buf[256];
	memset(buf, 0, sizeof buf);
	gethostname(buf, sizeof buf - 1);
	uint64_t h = fnv1a(FNV_OFFSET, buf, strlen(buf) + 1), boot = ddp_boot_id();
	h = fnv1a(h, &boot, sizeof boot);
	ssize_t m = readlink("/proc/self/ns/net", buf, sizeof buf);
	return m > 0 ? fnv1a(h, buf, (size_t)m) : h;
}

// rules_file reports whether Open MPI was given a file of dynamic rules
// for its collectives (coll_tuned_dynamic_rules_filename).
static int rules_file(void) {
	int count, set = 0;
	MPI_T_cvar_handle h;
	if (!cvar_open_n("coll_tuned_dynamic_rules_filename", &h, &count))
		return 0;
	char *buf = calloc((size_t)count + 2, 1);
	if (buf != NULL && MPI_T_cvar_read(h, buf) == MPI_SUCCESS)
		set = buf[0] != 0;
	free(buf);
	MPI_T_cvar_handle_free(&h);
	return set;
}

int ddp_hosts(MPI_Comm c, int size, int *hosts, int *can, int *host_of) {
	struct {
		uint64_t key;
		int32_t can, pad;
	} me = {host_key(), 0, 0}, *all;
	// This rank can set the algorithm when the user left it to Open MPI
	// (dynamic rules on, as ddp_init asked, with no algorithm, segment
	// size or rules file of the user's) and did not opt out.
	int prov, t_ok = MPI_T_init_thread(MPI_THREAD_SERIALIZED, &prov) == MPI_SUCCESS;
	const char *env = getenv("DDPGO_MPI_ALLREDUCE");
	if (t_ok && (env == NULL || strcmp(env, "mpi") != 0) && open_mpi_4()) {
		MPI_T_cvar_handle h;
		int dyn = 0; // a bool, which Open MPI's MPI_T writes as one byte
		if (cvar_open("coll_tuned_use_dynamic_rules", &h)) {
			MPI_T_cvar_read(h, &dyn);
			MPI_T_cvar_handle_free(&h);
		}
		me.can = dyn && cvar_zero("coll_tuned_allreduce_algorithm") &&
			 cvar_zero("coll_tuned_allreduce_algorithm_segmentsize") &&
			 cvar_zero("coll_tuned_reduce_scatter_block_algorithm") && !rules_file();
	}
	if (t_ok)
		MPI_T_finalize();
	// A rank that cannot take part in the all-gather says so first, so
	// that every rank fails instead of waiting for it.
	all = malloc(sizeof me * (size_t)size);
	int ok = all != NULL;
	int rc = MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, c);
	if (rc == MPI_SUCCESS && !ok)
		rc = MPI_ERR_NO_MEM;
	if (rc != MPI_SUCCESS) {
		free(all);
		return rc;
	}
	rc = MPI_Allgather(&me, sizeof me, MPI_BYTE, all, sizeof me, MPI_BYTE, c);
	if (rc == MPI_SUCCESS) {
		*hosts = 0;
		*can = 1;
		for (int i = 0; i < size; i++) {
			int seen = -1;
			for (int j = 0; j < i && seen < 0; j++)
				if (all[j].key == all[i].key)
					seen = j;
			if (host_of != NULL)
				host_of[i] = seen < 0 ? *hosts : host_of[seen];
			*hosts += seen < 0;
			*can &= all[i].can;
		}
	}
	free(all);
	return rc;
}

// set_algorithms writes coll_tuned_allreduce_algorithm and its segment
// size, and coll_tuned_reduce_scatter_block_algorithm, which Open MPI
// reads when it sets up a communicator's collectives.
static int set_algorithms(int alg, int segsize, int rsb) {
	int prov;
	if (MPI_T_init_thread(MPI_THREAD_SERIALIZED, &prov) != MPI_SUCCESS)
		return 0;
	int ok = cvar_set_int("coll_tuned_allreduce_algorithm", alg) &&
		 cvar_set_int("coll_tuned_allreduce_algorithm_segmentsize", segsize) &&
		 cvar_set_int("coll_tuned_reduce_scatter_block_algorithm", rsb);
	MPI_T_finalize();
	return ok;
}

void ddp_forced_allreduce(int *alg, int *segsize, int *rsb) {
	int prov;
	*alg = *segsize = *rsb = -1;
	if (MPI_T_init_thread(MPI_THREAD_SERIALIZED, &prov) != MPI_SUCCESS)
		return;
	cvar_int("coll_tuned_allreduce_algorithm", alg);
	cvar_int("coll_tuned_allreduce_algorithm_segmentsize", segsize);
	cvar_int("coll_tuned_reduce_scatter_block_algorithm", rsb);
	MPI_T_finalize();
}

int ddp_dup_algorithm(MPI_Comm c, int alg, int segsize, int rsb, MPI_Comm *out, int *made) {
	*out = MPI_COMM_NULL;
	*made = 0;
	// Every rank must set the algorithms, or none: ranks whose
	// communicators run different algorithms do not match.
	int ok = set_algorithms(alg, segsize, rsb);
	int rc = MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, c);
	if (rc == MPI_SUCCESS && ok) {
		rc = MPI_Comm_dup(c, out);
		if (rc == MPI_SUCCESS) {
			*made = 1;
			rc = MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
		}
	}
	// Every later communicator of every rank must have Open MPI's choice
	// again: a rank that could not restore it fails the job's Open.
	int restored = set_algorithms(0, 0, 0);
	int rc2 = MPI_Allreduce(MPI_IN_PLACE, &restored, 1, MPI_INT, MPI_MIN, c);
	if (rc == MPI_SUCCESS)
		rc = rc2 != MPI_SUCCESS ? rc2 : restored ? MPI_SUCCESS : MPI_ERR_OTHER;
	return rc;
}

int ddp_allreduce_int(MPI_Comm c, int *inout, int n, int max) {
	return MPI_Allreduce(MPI_IN_PLACE, inout, n, MPI_INT, max ? MPI_MAX : MPI_MIN, c);
}

// ---- operations ---------------------------------------------------------

MPI_Datatype ddp_type(int dt) {
	switch (dt) {
	case DDP_F32: return MPI_FLOAT;
	case DDP_F64: return MPI_DOUBLE;
	case DDP_I32: return MPI_INT32_T;
	case DDP_I64: return MPI_INT64_T;
	case DDP_U8: return MPI_UINT8_T;
	}
	return MPI_UINT16_T; // DDP_F16, DDP_BF16: reduced by the ops above
}

// ddp_op maps a reduction; Avg is a Sum here, divided afterwards, except
// DDP_AVG2 (floating types, two ranks), the pair averages above.
MPI_Op ddp_op(int op, int dt) {
	if (op == DDP_AVG2) {
		switch (dt) {
		case DDP_F32: return op_f32_avg2;
		case DDP_F64: return op_f64_avg2;
		case DDP_F16: return op_f16_avg2;
		case DDP_BF16: return op_bf16_avg2;
		}
		return MPI_OP_NULL;
	}
	if (dt == DDP_F16 || dt == DDP_BF16) {
		switch (op) {
		case DDP_MAX: return op_half_max;
		case DDP_MIN: return op_half_min;
		}
		return dt == DDP_F16 ? op_f16_sum : op_bf16_sum;
	}
	switch (op) {
	case DDP_MAX: return MPI_MAX;
	case DDP_MIN: return MPI_MIN;
	}
	return MPI_SUM;
}

int ddp_start(MPI_Comm c, int blocking, int slot, int kind, int op, int dt,
              int count, uintptr_t send, uintptr_t recv, int root, int inplace) {
	MPI_Datatype t = ddp_type(dt);
	MPI_Op o = ddp_op(op, dt);
	void *s = send ? (void *)send : empty, *r = recv ? (void *)recv : empty;
	const void *in = inplace ? MPI_IN_PLACE : s;
	MPI_Request *q = &reqs[slot];
	req_recv[slot] = 0;
	switch (kind) {
	case DDP_ALLREDUCE:
		return blocking ? MPI_Allreduce(in, r, count, t, o, c) : MPI_Iallreduce(in, r, count, t, o, c, q);
	case DDP_BROADCAST:
		return blocking ? MPI_Bcast(s, count, t, root, c) : MPI_Ibcast(s, count, t, root, c, q);
	case DDP_REDUCE:
		// inplace is set on the root only; elsewhere recv is unused.
		return blocking ? MPI_Reduce(in, r, count, t, o, root, c) : MPI_Ireduce(in, r, count, t, o, root, c, q);
	case DDP_ALLGATHER:
		// In place, send is this rank's block of recv, which is where
		// MPI_IN_PLACE takes the contribution from.
		return blocking ? MPI_Allgather(in, count, t, r, count, t, c) : MPI_Iallgather(in, count, t, r, count, t, c, q);
	case DDP_REDUCESCATTER:
		// Always out of place: the Go side gives an in-place call a
		// scratch recv, since MPI_IN_PLACE would leave the result in
		// block 0 rather than in this rank's block.
		return blocking ? MPI_Reduce_scatter_block(s, r, count, t, o, c) : MPI_Ireduce_scatter_block(s, r, count, t, o, c, q);
	case DDP_SEND:
		// Always non-blocking: a blocking send could hold the owner
		// thread while the peer waits for it elsewhere.
		return MPI_Isend(s, count, t, root, 0, c, q);
	case DDP_RECV:
		req_recv[slot] = 1;
		req_type[slot] = t;
		return MPI_Irecv(r, count, t, root, 0, c, q);
	case DDP_BARRIER:
		return blocking ? MPI_Barrier(c) : MPI_Ibarrier(c, q);
	}
	return MPI_ERR_ARG;
}

int ddp_test_rc;

int ddp_testsome(int n) {
	int outcount = 0;
	int rc = MPI_Testsome(n, reqs, &outcount, ddp_done, stats);
	if (outcount == MPI_UNDEFINED || (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS)) {
		ddp_test_rc = rc;
		return 0;
	}
	for (int i = 0; i < outcount; i++) {
		int k = ddp_done[i];
		ddp_errs[i] = rc == MPI_ERR_IN_STATUS ? stats[i].MPI_ERROR : rc;
		ddp_got[i] = -1;
		if (req_recv[k] && ddp_errs[i] == MPI_SUCCESS)
			MPI_Get_count(&stats[i], req_type[k], &ddp_got[i]);
	}
	ddp_test_rc = MPI_SUCCESS;
	return outcount;
}

// ---- after the reduction ------------------------------------------------

#define DIV(T)                                         \
	do {                                               \
		T *p = (T *)buf;                               \
		for (int i = 0; i < count; i++) p[i] /= (T)n; \
	} while (0)

__attribute__((optimize("O3"))) void ddp_scale(int dt, uintptr_t buf, int count, int n) {
	switch (dt) {
	case DDP_F32: DIV(float); break;
	case DDP_F64: DIV(double); break;
	case DDP_I32: DIV(int32_t); break;
	case DDP_I64: DIV(int64_t); break;
	case DDP_U8:
		if (n > 255) { // the divisor does not fit the type: as inproc, zero
			memset((void *)buf, 0, count);
			break;
		}
		DIV(uint8_t);
		break;
	case DDP_F16: {
		uint16_t *p = (uint16_t *)buf;
		for (int i = 0; i < count; i++) p[i] = float_to_half(half_to_float(p[i]) / (float)n);
		break;
	}
	case DDP_BF16: {
		uint16_t *p = (uint16_t *)buf;
		for (int i = 0; i < count; i++) p[i] = float_to_bf16(bf16_to_float(p[i]) / (float)n);
		break;
	}
	}
}

void ddp_test_reduce(int dt, int op, uintptr_t in, uintptr_t inout, int count, int f16c) {
	int saved = has_f16c, saved2 = has_avx2;
	__builtin_cpu_init();
	has_f16c = f16c && ddp_has_f16c();
	has_avx2 = f16c && __builtin_cpu_supports("avx2"); // f16c here means: the SIMD paths
	MPI_Datatype t = MPI_DATATYPE_NULL;
	void (*f)(void *, void *, int *, MPI_Datatype *) = NULL;
	if (op == DDP_MAX) f = half_max;
	else if (op == DDP_MIN) f = half_min;
	else if (op == DDP_AVG2) f = dt == DDP_F16 ? f16_avg2 : dt == DDP_BF16 ? bf16_avg2 : dt == DDP_F32 ? f32_avg2 : f64_avg2;
	else f = dt == DDP_F16 ? f16_sum : bf16_sum;
	f((void *)in, (void *)inout, &count, &t);
	has_f16c = saved;
	has_avx2 = saved2;
}

// ---- errors, version, abort ---------------------------------------------

void ddp_error_string(int code, char *buf, int len, int *class) {
	int n = 0;
	if (MPI_Error_class(code, class) != MPI_SUCCESS)
		*class = -1;
	if (len < MPI_MAX_ERROR_STRING || MPI_Error_string(code, buf, &n) != MPI_SUCCESS)
		n = 0;
	buf[n] = 0;
}

void ddp_library_version(char *buf, int len) {
	int n = 0;
	if (len < MPI_MAX_LIBRARY_VERSION_STRING || MPI_Get_library_version(buf, &n) != MPI_SUCCESS)
		n = 0;
	buf[n] = 0;
}

void ddp_abort_job(int code) {
	MPI_Abort(MPI_COMM_WORLD, code);
	_exit(code); // MPI_Abort does not return; if it did, end anyway
}
