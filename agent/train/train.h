/* agent/train/train.h — the training library of wagma-agent (static library wagma_train).
 *
 * Private to agent/: the agent daemon and the tests include it by path.
 *
 *   backend    where the math runs: "cpu" (OpenBLAS, host memory; the default) or "cuda"
 *              (cuBLAS and CUDA kernels, device memory; built when CMake finds CUDA). Models
 *              and optimizers are written once against the backend's table of operations
 *              (backend.h); the element-wise math is shared source (elementwise.h).
 *   model      softmax regression, MLP, LeNet-5. ALL parameters live in one contiguous float32
 *              buffer and the gradients in another of the same layout, so a collective moves
 *              one buffer. forward() = loss + accuracy on a batch, backward() = gradient of the
 *              batch-mean loss, written (not accumulated) into the gradient buffer.
 *   optim      SGD (momentum, Nesterov, weight decay), Adam / AdamW over the flat buffer, with
 *              a linear warmup + step-decay learning-rate schedule. State is one flat buffer.
 *   dataset    Fashion-MNIST (IDX, gzip via zlib) and a seeded synthetic generator
 *              (gaussian class clusters), 784 features and 10 classes either way.
 *   sampler    per-worker seeded minibatch stream over the WHOLE training set; seekable, so a
 *              resumed worker continues its stream from an iteration count alone.
 *   checkpoint parameters + optimizer state + iteration, atomic (tmp, fsync, rename), with a
 *              validated header and CRC32 checksums; the same bytes whichever backend wrote it.
 *
 * CPU math goes through OpenBLAS (cblas_sgemm), one BLAS thread unless
 * wagma_train_set_threads() says otherwise. Everything is deterministic for a seed (same
 * machine, same BLAS, same thread count; on CUDA, same GPU model and library versions).
 * Handles are not thread-safe: one thread uses a model/optimizer/sampler/backend at a time.
 *
 * Errors: functions that can fail return 0 or a negative WAGMA_E* code and, when err is not
 * NULL, write a one-line detail message into err[0..err_len). */
#ifndef WAGMA_AGENT_TRAIN_H
#define WAGMA_AGENT_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "wagma/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- threads */

/* Sets the number of BLAS threads of this process (n >= 1). Without a call, the first
 * wagma_model_create() sets 1. Returns WAGMA_EINVAL for n < 1. */
int wagma_train_set_threads(int n);
/* The thread count last set through this library (1 by default). */
int wagma_train_threads(void);

/* ---------------------------------------------------------------- backends */

/* A compute backend: "cpu" or "cuda" (device 0) / "cuda:N". The CPU backend is a process-wide
 * singleton without state; a CUDA backend owns a CUDA context on its device, a compute stream,
 * a transfer stream and a cuBLAS handle. Models and optimizers created on a backend keep a
 * pointer to it: close it after them. */
typedef struct wagma_backend wagma_backend_t;

/* The CPU backend (never NULL; closing it does nothing). */
wagma_backend_t *wagma_backend_cpu(void);
/* 1 when this build contains the CUDA backend (CMake found CUDA), else 0. */
int wagma_train_have_cuda(void);
/* Checks without opening whether `name` can be opened here: 0, or WAGMA_EINVAL (unknown
 * name), WAGMA_ENOSYS (a CUDA name in a build without CUDA) or WAGMA_EUNAVAIL (no NVIDIA
 * driver, no GPU, no such device), with the cause in err. Fast: no context is created. */
int wagma_backend_probe(const char *name, char *err, size_t err_len);
/* Opens a backend ("cpu" returns wagma_backend_cpu()). Errors as wagma_backend_probe, plus
 * WAGMA_ENOMEM / WAGMA_EIO when the device cannot be set up. */
int wagma_backend_open(const char *name, wagma_backend_t **out, char *err, size_t err_len);
void wagma_backend_close(wagma_backend_t *b);
/* "cpu", or e.g. "cuda:0 NVIDIA H100 80GB HBM3 (sm_90, 79 GiB)". */
const char *wagma_backend_name(const wagma_backend_t *b);
/* 1 when the backend's buffers are host memory (cpu), 0 for device memory (cuda). */
int wagma_backend_host_memory(const wagma_backend_t *b);
/* Waits for all work queued on the backend; returns its first error (sticky), if any. */
int wagma_backend_sync(wagma_backend_t *b);
/* The detail of the backend's first error ("" when none). */
const char *wagma_backend_error(const wagma_backend_t *b);
/* Host memory the backend copies to and from fastest: page-locked (cudaMallocHost) on CUDA,
 * plain malloc on the CPU. For wagma_model_params_download_async. NULL when out of memory. */
void *wagma_backend_host_alloc(wagma_backend_t *b, size_t bytes);
void wagma_backend_host_free(wagma_backend_t *b, void *p);

/* ---------------------------------------------------------------- random streams */

/* xoshiro256** seeded through splitmix64. Plain value: copy it to fork a stream. */
typedef struct wagma_rng {
  uint64_t s[4];
} wagma_rng_t;

void wagma_rng_seed(wagma_rng_t *rng, uint64_t seed);
uint64_t wagma_rng_next(wagma_rng_t *rng);
/* Uniform in [0, bound) without modulo bias; bound >= 1. */
uint64_t wagma_rng_below(wagma_rng_t *rng, uint64_t bound);
/* Uniform in [0, 1). */
double wagma_rng_uniform(wagma_rng_t *rng);
/* Standard normal (Box-Muller, no cached second value: the stream is a pure sequence). */
double wagma_rng_normal(wagma_rng_t *rng);
/* splitmix64 finalizer: a well-mixed 64-bit function of x. */
uint64_t wagma_mix64(uint64_t x);
/* Derives a stream seed from a job seed and a label (e.g. the worker's name, which stays
 * stable across membership changes while ranks do not). label may be NULL. */
uint64_t wagma_seed_derive(uint64_t seed, const char *label);

/* ---------------------------------------------------------------- datasets */

/* n samples of `features` values each, labels in [0, classes). Pixels from IDX files are kept
 * as bytes (x = byte * scale + offset at gather time), synthetic data as floats. Exactly one of
 * x_u8 / x_f32 is non-NULL. Images are rows*cols, one channel; features = rows*cols. */
typedef struct wagma_dataset {
  size_t n;
  size_t features;
  size_t classes;
  size_t rows, cols;
  uint8_t *x_u8;
  float *x_f32;
  uint8_t *labels;
  float scale, offset; /* used with x_u8 only */
} wagma_dataset_t;

/* Frees what the dataset owns and zeroes it. Safe on a zeroed or already freed dataset. */
void wagma_dataset_free(wagma_dataset_t *ds);

/* Loads an IDX image file (magic 0x00000803, unsigned bytes, 3 dims) and its IDX label file
 * (0x00000801, 1 dim), gzip-compressed or plain (zlib reads both). Validates the magic, the
 * dimensions (nonzero, <= 65536 rows/cols, equal counts), the exact payload length (truncated
 * or trailing data is an error) and that labels are < classes (classes in 2..256). Pixels are
 * scaled to [0, 1] (scale 1/255, offset 0). On success *ds owns the data; on error *ds is
 * zeroed. Errors: WAGMA_EIO (open/read), WAGMA_EPROTO (bad file), WAGMA_ENOMEM, WAGMA_EINVAL. */
int wagma_dataset_load_idx(wagma_dataset_t *ds, const char *images_path, const char *labels_path,
                           size_t classes, char *err, size_t err_len);

/* The Debian package dataset-fashion-mnist installs here. */
#define WAGMA_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"

/* Loads train-{images,labels} and t10k-{images,labels} (*-idx?-ubyte.gz, or without .gz) from
 * dir (NULL = WAGMA_FASHION_MNIST_DIR) and standardizes both with the TRAINING set's pixel
 * mean and standard deviation. test may be NULL. WAGMA_ENOTFOUND when the files are missing. */
int wagma_dataset_load_fashion_mnist(const char *dir, wagma_dataset_t *train, wagma_dataset_t *test,
                                     char *err, size_t err_len);

/* Sets x = (byte/255 - mean) / std for a byte dataset. WAGMA_EINVAL on float data or std <= 0. */
int wagma_dataset_standardize(wagma_dataset_t *ds, float mean, float std);

/* Synthetic classification data: `classes` gaussian clusters in `features` dimensions.
 * Class centres are images constant on 4x4 pixel blocks, each block drawn from
 * N(0, separation^2 / features) (so two centres are about separation*sqrt(2) apart), samples are
 * centre + N(0, noise^2) per pixel, labels are uniform. The centres depend on `seed` only, the
 * samples on (seed, split): split 0 = training set, 1 = test set, any other value another draw of
 * the same task. */
typedef struct wagma_synthetic_config {
  size_t n;          /* samples */
  size_t features;   /* 784 by default, as rows x cols */
  size_t rows, cols; /* 28 x 28 by default; rows*cols must equal features, cols <= 4096 */
  size_t classes;    /* 10 by default */
  float separation;  /* 6.0 by default */
  float noise;       /* 1.0 by default */
  uint64_t seed;
  uint32_t split;
} wagma_synthetic_config_t;

/* The defaults above for n samples. */
wagma_synthetic_config_t wagma_synthetic_defaults(size_t n, uint64_t seed, uint32_t split);
int wagma_dataset_synthetic(wagma_dataset_t *ds, const wagma_synthetic_config_t *cfg, char *err,
                            size_t err_len);

/* Copies samples idx[0..count) into x (count*features floats) and y (count labels).
 * Indices must be < ds->n (WAGMA_ERANGE otherwise, nothing meaningful written). */
int wagma_dataset_gather(const wagma_dataset_t *ds, const uint32_t *idx, size_t count, float *x,
                         int32_t *y);

/* ---------------------------------------------------------------- minibatch sampling */

/* How a worker draws from the whole training set:
 *  SHUFFLE      (default) per-worker shuffled epochs: the worker walks a permutation of all n
 *               samples, a fresh permutation per epoch, seeded by (stream seed, epoch). Every
 *               sample is seen once per worker-epoch; workers walk different permutations.
 *  REPLACEMENT  sample k of the stream is hash(stream seed, k) mod n: i.i.d. with replacement.
 * Both are pure functions of (seed, k), so seek(k) resumes a stream exactly. */
enum wagma_sample_mode { WAGMA_SAMPLE_SHUFFLE = 0, WAGMA_SAMPLE_REPLACEMENT = 1 };

typedef struct wagma_sampler {
  int mode;
  uint64_t seed;
  size_t n;
  uint64_t drawn;      /* samples drawn so far from this stream */
  uint32_t *perm;      /* SHUFFLE: permutation of the current epoch */
  uint64_t perm_epoch; /* epoch perm belongs to, UINT64_MAX when none */
} wagma_sampler_t;

/* n must be in 1..UINT32_MAX. seed: use wagma_seed_derive(job_seed, worker_name). */
int wagma_sampler_init(wagma_sampler_t *s, size_t n, int mode, uint64_t seed);
void wagma_sampler_free(wagma_sampler_t *s);
/* Positions the stream after `drawn` samples (e.g. iteration * batch size after a restart). */
void wagma_sampler_seek(wagma_sampler_t *s, uint64_t drawn);
/* Writes the next count indices. WAGMA_ENOMEM only in SHUFFLE mode at an epoch change. */
int wagma_sampler_next(wagma_sampler_t *s, uint32_t *idx, size_t count);

/* A minibatch buffer: up to cap samples. */
typedef struct wagma_batch {
  size_t cap, n, features;
  float *x;
  int32_t *y;
  uint32_t *idx;
} wagma_batch_t;

int wagma_batch_alloc(wagma_batch_t *b, size_t cap, size_t features);
void wagma_batch_free(wagma_batch_t *b);
/* Draws count (<= cap) indices from s and gathers them from ds into b. */
int wagma_batch_draw(wagma_batch_t *b, wagma_sampler_t *s, const wagma_dataset_t *ds, size_t count);

/* ---------------------------------------------------------------- models */

enum wagma_train_arch { WAGMA_ARCH_SOFTMAX = 0, WAGMA_ARCH_MLP = 1, WAGMA_ARCH_LENET5 = 2 };
enum wagma_activation { WAGMA_ACT_RELU = 0, WAGMA_ACT_TANH = 1 };
enum wagma_pool_mode { WAGMA_POOL_MAX = 0, WAGMA_POOL_AVG = 1 };

#define WAGMA_MLP_MAX_HIDDEN 8

typedef struct wagma_model_config {
  int arch;                            /* enum wagma_train_arch */
  size_t channels, rows, cols;         /* input image, 1 x 28 x 28 by default */
  size_t classes;                      /* 10 by default */
  size_t hidden[WAGMA_MLP_MAX_HIDDEN]; /* MLP hidden sizes, default 256, 128 */
  size_t n_hidden;
  int activation;   /* enum wagma_activation, ReLU by default */
  int pool;         /* enum wagma_pool_mode (LeNet-5), max by default */
  size_t max_batch; /* largest batch forward() accepts, 256 by default */
} wagma_model_config_t;

/* Defaults for an architecture (see the fields). LeNet-5: conv 5x5 6ch (pad 2 on 28x28, so any
 * input of at least 12x12 works) + pool 2, conv 5x5 16ch + pool 2, fc 120, fc 84, fc classes. */
wagma_model_config_t wagma_model_defaults(int arch);

/* Parses "softmax", "mlp", "mlp:512-256-128", "lenet5" (also "lenet"), with optional suffixes
 * ",tanh" ",relu" ",avgpool" ",maxpool". Starts from wagma_model_defaults(arch). */
int wagma_model_config_parse(const char *spec, wagma_model_config_t *cfg, char *err,
                             size_t err_len);

typedef struct wagma_model wagma_model_t;

/* Builds a model with zero parameters on the CPU backend; call wagma_model_init(). *out is
 * owned by the caller (wagma_model_destroy). */
int wagma_model_create(const wagma_model_config_t *cfg, wagma_model_t **out, char *err,
                       size_t err_len);
/* The same on backend b (NULL = the CPU): parameters, gradients, activations and scratch live
 * in b's memory, the math runs there. b must outlive the model. */
int wagma_model_create_on(wagma_backend_t *b, const wagma_model_config_t *cfg, wagma_model_t **out,
                          char *err, size_t err_len);
void wagma_model_destroy(wagma_model_t *m);
wagma_backend_t *wagma_model_backend(const wagma_model_t *m);

/* Deterministic initialisation from seed: He-uniform weights for ReLU, Glorot-uniform for tanh
 * and the output layer, zero biases. Same seed and config = same bits. */
void wagma_model_init(wagma_model_t *m, uint64_t seed);

size_t wagma_model_param_count(const wagma_model_t *m);
/* param_count floats, owned by the model, in its backend's memory: host memory on the CPU,
 * DEVICE memory on CUDA (then only for backend operations and wagma_optim_step; use the
 * get/set calls below from the host). */
float *wagma_model_params(wagma_model_t *m);
float *wagma_model_grads(wagma_model_t *m); /* same layout */
/* Host copies of the parameters / gradients (param_count floats; waits for queued work), and
 * parameters set from the host. Same layout and bytes on every backend. */
int wagma_model_get_params(wagma_model_t *m, float *host);
int wagma_model_get_grads(wagma_model_t *m, float *host);
int wagma_model_set_params(wagma_model_t *m, const float *host);
/* Gradients set from the host (the mean of an allreduce across members, before the update). */
int wagma_model_set_grads(wagma_model_t *m, const float *host);
/* The snapshot copy for the collective: starts copying the parameters, as they are after all
 * work issued so far, into host (param_count floats; page-locked memory from
 * wagma_backend_host_alloc for a truly asynchronous copy) on the backend's transfer stream,
 * and returns at once. Training may go on meanwhile: forward and backward run concurrently
 * with the copy, and the next wagma_optim_step / wagma_model_set_params waits (on the device)
 * for the copy before it writes the parameters. wagma_model_params_download_wait() waits for
 * the copy (host is complete when it returns 0). One copy in flight per backend (WAGMA_EBUSY).
 * On the CPU the copy is done when _async returns. */
int wagma_model_params_download_async(wagma_model_t *m, float *host);
int wagma_model_params_download_wait(wagma_model_t *m);
const wagma_model_config_t *wagma_model_config(const wagma_model_t *m);
/* Human-readable layer list, e.g. "lenet5 conv5x5x6-relu-maxpool2-...", and a 64-bit
 * signature of the network (architecture, shapes, parameter layout) stored in checkpoints. */
const char *wagma_model_describe(const wagma_model_t *m);
uint64_t wagma_model_signature(const wagma_model_t *m);

typedef struct wagma_eval {
  double loss;    /* mean softmax cross-entropy over the samples */
  size_t correct; /* arg-max predictions equal to the label */
  size_t n;       /* samples */
} wagma_eval_t;

/* Forward pass on n (1..max_batch) samples: x is n x (channels*rows*cols) floats, y the labels
 * (each in [0, classes), WAGMA_EINVAL otherwise), both in HOST memory on every backend (on
 * CUDA they are staged through page-locked memory; the upload overlaps the previous step's
 * backward and update still running on the device). Fills *out (may be NULL). The model keeps
 * what backward() needs (x is copied). Returns the backend's error (WAGMA_EIO) if its queued
 * work failed. */
int wagma_model_forward(wagma_model_t *m, const float *x, const int32_t *y, size_t n,
                        wagma_eval_t *out);
/* Writes into the gradient buffer the gradient of the mean loss of the last forward batch.
 * WAGMA_EINVAL when no forward preceded it. */
int wagma_model_backward(wagma_model_t *m);
/* Forward over samples [first, first+count) of ds in batches of max_batch (count 0 = to the end);
 * out->loss is the mean over them. ds->features must match the model's input. Leaves the
 * gradients alone but ends the last forward: backward() needs a new forward afterwards. */
int wagma_model_evaluate(wagma_model_t *m, const wagma_dataset_t *ds, size_t first, size_t count,
                         wagma_eval_t *out);

/* ---------------------------------------------------------------- optimizers */

enum wagma_optim_kind { WAGMA_OPTIM_SGD = 0, WAGMA_OPTIM_ADAM = 1, WAGMA_OPTIM_ADAMW = 2 };

/* lr(t) = lr * w(t) * decay^floor(t / decay_every), where t is the job iteration (from 0),
 * w(t) = (t+1)/warmup_steps for t < warmup_steps and 1 after; decay_every 0 = no decay. */
typedef struct wagma_lr_schedule {
  float lr;
  uint64_t warmup_steps;
  uint64_t decay_every;
  float decay; /* e.g. 0.1 */
} wagma_lr_schedule_t;

double wagma_lr_at(const wagma_lr_schedule_t *s, uint64_t iteration);

/* SGD (PyTorch conventions): g = grad + weight_decay * w; v = momentum * v + g;
 *   step = nesterov ? g + momentum * v : v (plain g when momentum is 0); w -= lr * step.
 * ADAM: g = grad + weight_decay * w (L2); m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 *   w -= lr * (m / (1-b1^k)) / (sqrt(v / (1-b2^k)) + eps), k = updates taken so far + 1.
 * ADAMW: as ADAM with g = grad, and w -= lr * weight_decay * w first (decoupled decay). */
typedef struct wagma_optim_config {
  int kind; /* enum wagma_optim_kind */
  wagma_lr_schedule_t schedule;
  float momentum;
  int nesterov;
  float weight_decay;
  float beta1, beta2, eps;
} wagma_optim_config_t;

/* SGD, lr 0.05, momentum 0.9, no decay; Adam betas 0.9/0.999, eps 1e-8 (used by Adam kinds). */
wagma_optim_config_t wagma_optim_defaults(int kind);

typedef struct wagma_optim wagma_optim_t;

/* On the CPU backend. */
int wagma_optim_create(const wagma_optim_config_t *cfg, size_t n_params, wagma_optim_t **out,
                       char *err, size_t err_len);
/* On backend b (NULL = the CPU): the state lives in b's memory and the updates run there; b
 * must outlive the optimizer. */
int wagma_optim_create_on(wagma_backend_t *b, const wagma_optim_config_t *cfg, size_t n_params,
                          wagma_optim_t **out, char *err, size_t err_len);
void wagma_optim_destroy(wagma_optim_t *o);
wagma_backend_t *wagma_optim_backend(const wagma_optim_t *o);
/* One update at job iteration `iteration` (which picks the learning rate). params and grads
 * are in the optimizer's backend memory (wagma_model_params / wagma_model_grads of a model on
 * the same backend). Queued on CUDA: it returns before the update is done. */
void wagma_optim_step(wagma_optim_t *o, uint64_t iteration, float *params, const float *grads);
/* Flat state: SGD with momentum = velocity (n floats), SGD without = none (0), Adam = m then v
 * (2n floats). Owned by the optimizer, in its backend's memory (device memory on CUDA: use
 * get/set_state from the host); the length goes to *len. */
float *wagma_optim_state(wagma_optim_t *o, size_t *len);
/* Host copy of the state / state set from the host (state length floats). */
int wagma_optim_get_state(wagma_optim_t *o, float *host);
int wagma_optim_set_state(wagma_optim_t *o, const float *host);
uint64_t wagma_optim_updates(const wagma_optim_t *o); /* updates taken (Adam bias correction) */
void wagma_optim_set_updates(wagma_optim_t *o, uint64_t updates);
const wagma_optim_config_t *wagma_optim_config(const wagma_optim_t *o);
/* Zeroes the state and the update count. */
void wagma_optim_reset(wagma_optim_t *o);

/* Gradient delay line (grad_delay.c): applies any optimizer's gradients d steps late, as the
 * delayed-gradient studies do. A FIFO of d + 1 gradient buffers in the backend's memory;
 * push(g_t) copies g_t in and returns g_{t-d} (the gradient pushed d pushes earlier), or NULL
 * for the first d pushes, when no gradient is that old (the caller then takes no step).
 * d = 0 keeps no buffer and returns g_t itself. Memory: (d + 1) x n floats. The line's
 * contents are not checkpointed: a resumed worker starts with an empty line. */
#define WAGMA_GRAD_DELAY_MAX 1024u
typedef struct wagma_grad_delay wagma_grad_delay_t;

/* delay in 0..WAGMA_GRAD_DELAY_MAX (WAGMA_EINVAL otherwise), n_params > 0; b NULL = the CPU.
 * Ownership: *out is the caller's (wagma_grad_delay_destroy); b must outlive it. */
int wagma_grad_delay_create_on(wagma_backend_t *b, size_t n_params, unsigned delay,
                               wagma_grad_delay_t **out, char *err, size_t err_len);
void wagma_grad_delay_destroy(wagma_grad_delay_t *q);
/* grads: n_params floats in the backend's memory. The pointer returned (backend memory, owned
 * by the line unless it is grads) stays valid until the next push. Stream-ordered on CUDA. */
const float *wagma_grad_delay_push(wagma_grad_delay_t *q, const float *grads);
unsigned wagma_grad_delay_length(const wagma_grad_delay_t *q); /* d */
uint64_t wagma_grad_delay_pushed(const wagma_grad_delay_t *q); /* pushes since create/clear */
/* Forgets every gradient held (the next d pushes return NULL again). */
void wagma_grad_delay_clear(wagma_grad_delay_t *q);
/* push(grads), then wagma_optim_step(o, iteration, params, g_{t-d}) when there is one.
 * Returns 1 when a step was taken, 0 when the line was still filling. */
int wagma_optim_step_delayed(wagma_optim_t *o, wagma_grad_delay_t *q, uint64_t iteration,
                             float *params, const float *grads);

/* ---------------------------------------------------------------- checkpoints */

/* File: a 96-byte little-endian header (magic "WGMACKPT", version, header CRC, model signature,
 * parameter count, optimizer kind, state length, update count, iteration, payload CRC32) then
 * the parameters and the optimizer state as float32. Written to "<path>.tmp.<pid>", fsync'ed,
 * renamed over path, and the directory fsync'ed: a reader sees the old or the new file whole.
 * o may be NULL (parameters only). */
int wagma_checkpoint_save(const char *path, wagma_model_t *m, wagma_optim_t *o, uint64_t iteration,
                          char *err, size_t err_len);
/* Validates everything (magic, version, header CRC, sizes against m and o, model signature,
 * payload length and CRC) before it touches m or o; on any mismatch returns WAGMA_EPROTO (corrupt)
 * or WAGMA_EINVAL (another model/optimizer) and leaves m and o unchanged. o may be NULL (the
 * optimizer state in the file is then skipped). WAGMA_ENOTFOUND when path does not exist. */
int wagma_checkpoint_load(const char *path, wagma_model_t *m, wagma_optim_t *o, uint64_t *iteration,
                          char *err, size_t err_len);
/* The same on the file `name` (one path component: no '/', not "." or "..") of the open
 * directory dirfd, never following a symbolic link there: save creates its temporary file with
 * O_NOFOLLOW and renames it over name (a link at name is replaced, not written through); load
 * opens name with O_NOFOLLOW (a link is WAGMA_EPERM) and refuses anything but a regular file
 * (WAGMA_EPROTO). The caller confines dirfd (agent/ckroot.c walks to it without links). */
int wagma_checkpoint_save_at(int dirfd, const char *name, wagma_model_t *m, wagma_optim_t *o,
                             uint64_t iteration, char *err, size_t err_len);
int wagma_checkpoint_load_at(int dirfd, const char *name, wagma_model_t *m, wagma_optim_t *o,
                             uint64_t *iteration, char *err, size_t err_len);

#ifdef __cplusplus
}
#endif
#endif
