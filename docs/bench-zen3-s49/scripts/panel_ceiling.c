// Scratch: gcc -O3 -mavx2 -mfma panel_ceiling.c && ./a.out (one thread, everything in L1).
// Cycles per k-step of panel kernels from L1 (no memory traffic): R rows x V panels of 8.
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define K 512
static uint16_t W[4][K*16] __attribute__((aligned(64)));
static float X[8][K] __attribute__((aligned(64)));
static inline __m256 widen(const uint16_t* p){return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)),16));}
#define KERNEL(NAME,R,V) \
__attribute__((noinline)) void NAME(float* out, long reps){ \
  __m256 acc[V][R]; for(int v=0;v<V;v++)for(int r=0;r<R;r++)acc[v][r]=_mm256_setzero_ps(); \
  for(long t=0;t<reps;t++) for(int k=0;k<K;k++){ __m256 w[V]; \
    for(int v=0;v<V;v++) w[v]=widen(W[v]+k*8); \
    for(int r=0;r<R;r++){__m256 xb=_mm256_broadcast_ss(&X[r][k]); for(int v=0;v<V;v++) acc[v][r]=_mm256_fmadd_ps(w[v],xb,acc[v][r]);}} \
  for(int v=0;v<V;v++)for(int r=0;r<R;r++)_mm256_storeu_ps(out+(v*R+r)*8,acc[v][r]);}
// 16 outputs per 256-bit load: even outputs by shift, odd by and-mask
#define KERNEL16(NAME,R) \
__attribute__((noinline)) void NAME(float* out, long reps){ \
  const __m256i mask=_mm256_set1_epi32(0xFFFF0000); __m256 acc[2][R]; for(int v=0;v<2;v++)for(int r=0;r<R;r++)acc[v][r]=_mm256_setzero_ps(); \
  for(long t=0;t<reps;t++) for(int k=0;k<K;k++){ __m256i raw=_mm256_load_si256((const __m256i*)(W[0]+k*16)); \
    __m256 w0=_mm256_castsi256_ps(_mm256_slli_epi32(raw,16)), w1=_mm256_castsi256_ps(_mm256_and_si256(raw,mask)); \
    for(int r=0;r<R;r++){__m256 xb=_mm256_broadcast_ss(&X[r][k]); acc[0][r]=_mm256_fmadd_ps(w0,xb,acc[0][r]); acc[1][r]=_mm256_fmadd_ps(w1,xb,acc[1][r]);}} \
  for(int v=0;v<2;v++)for(int r=0;r<R;r++)_mm256_storeu_ps(out+(v*R+r)*8,acc[v][r]);}
KERNEL(k1x2,1,2) KERNEL(k4x3,4,3) KERNEL(k5x2,5,2) KERNEL(k6x2,6,2) KERNEL(k8x1,8,1) KERNEL(k4x2,4,2)
KERNEL16(p5,5) KERNEL16(p6,6) KERNEL16(p4,4) KERNEL16(p3,3)
typedef void (*fn)(float*,long);
int main(){
  for(int i=0;i<K*16;i++){W[0][i]=W[1][i]=W[2][i]=W[3][i]=0x3f80;} for(int r=0;r<8;r++)for(int k=0;k<K;k++)X[r][k]=1e-6f;
  float out[1024]; struct {const char*n; fn f; int fmas;} ks[]={{"8-wide R1 V2",k1x2,2},{"8-wide R4 V2",k4x2,8},{"8-wide R4 V3",k4x3,12},{"8-wide R5 V2",k5x2,10},{"8-wide R6 V2",k6x2,12},{"8-wide R8 V1",k8x1,8},
   {"16-and R3",p3,6},{"16-and R4",p4,8},{"16-and R5",p5,10},{"16-and R6",p6,12}};
  for(int i=0;i<10;i++){ long reps=20000; ks[i].f(out,100); double t=now(); ks[i].f(out,reps); t=now()-t;
    double ns=t/(reps*(double)K); printf("%-14s %.3f ns/k  %.2f FMA/ns  (%d FMA/k)\n", ks[i].n, ns*1e9, ks[i].fmas/(ns*1e9), ks[i].fmas);}
}
