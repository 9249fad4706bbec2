/* api/spec.c — the job spec codec: defaults, strict decoding (unknown fields rejected, every
 * error names its field as a dotted path), cross-field validation, encoding with every field,
 * the PATCH body (mutable fields only), and program names (a program job's "program" object
 * and what it rules out: built-in model and dataset, the asynchronous algorithms, the
 * gradient delay line, the built-in checkpoints).
 *
 * Defaults live in wagma_job_spec_init and are documented in api/openapi.yaml and docs/api.md;
 * keep the three in agreement. Pure functions, thread-safe. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_util.h"
#include "wagma/api.h"

#define NELEM(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const char *const model_names[] = {"softmax", "mlp", "lenet5"};
static const char *const dataset_names[] = {"fashion-mnist", "synthetic"};
static const char *const algorithm_names[] = {"wagma",  "allreduce", "local-sgd",
                                              "adpsgd", "asgd",      "dc-asgd"};
static const char *const sync_names[] = {"barrier", "wait-avoiding"};
static const char *const optimizer_names[] = {"sgd", "adam"};
static const char *const device_names[] = {"cpu", "cuda"};

#define ENUM_NAME(table, v) ((int)(v) >= 0 && (int)(v) < NELEM(table) ? table[(int)(v)] : "?")
const char *wagma_model_name(wagma_model_kind_t v) {
  return ENUM_NAME(model_names, v);
}
const char *wagma_dataset_name(wagma_dataset_kind_t v) {
  return ENUM_NAME(dataset_names, v);
}
const char *wagma_algorithm_name(wagma_algorithm_t v) {
  return ENUM_NAME(algorithm_names, v);
}
const char *wagma_sync_name(wagma_sync_t v) {
  return ENUM_NAME(sync_names, v);
}
const char *wagma_optimizer_name(wagma_optimizer_type_t v) {
  return ENUM_NAME(optimizer_names, v);
}
const char *wagma_device_name(wagma_device_t v) {
  return ENUM_NAME(device_names, v);
}

#define MAX_ITERATIONS 1000000000000ULL /* 1e12 */
#define MAX_EPOCHS 1000000ULL

int wagma_api_name_valid(const char *name) {
  if (!name)
    return 0;
  size_t n = strlen(name);
  if (n == 0 || n >= WAGMA_API_NAME_MAX || name[0] == '.' || name[0] == '-')
    return 0;
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '.' || c == '_' || c == '-';
    if (!ok)
      return 0;
  }
  return 1;
}

int wagma_program_name_valid(const char *name) {
  /* the job-name alphabet; a leading '.' already rules out "." and ".." */
  return wagma_api_name_valid(name) && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

#define PROGRAM_NAME_RULE                                                                          \
  "must be 1-63 characters of [A-Za-z0-9._-], not starting with '.' or '-' (a file name in "       \
  "the agents' --programs directory: no '/', no '..')"

/* asgd and dc-asgd: workers push gradients to parameter-server shards without a barrier. */
static int is_async_ps(wagma_algorithm_t a) {
  return a == WAGMA_ALGO_ASGD || a == WAGMA_ALGO_DC_ASGD;
}

void wagma_job_spec_init(wagma_job_spec_t *s) {
  memset(s, 0, sizeof *s);
  s->model = WAGMA_MODEL_SOFTMAX;
  s->dataset = WAGMA_DATASET_FASHION_MNIST;
  s->algorithm = WAGMA_ALGO_WAGMA;
  s->group_size = 4;
  s->staleness_bound = 8;
  s->global_sync = WAGMA_SYNC_BARRIER;
  s->optimizer.type = WAGMA_OPT_SGD;
  s->optimizer.lr = 0.05;
  s->optimizer.momentum = 0.9;
  s->batch_size = 64;
  s->iterations = 1000;
  s->eval_every = 100;
  s->seed = 1;
  s->device = WAGMA_DEVICE_CPU;
  s->ps_shards = 1;
  s->dc_lambda = 0.04;
  s->program.max_restarts = 3;
}

/* "program": {"name" (required), "args" (optional), "max_restarts" (optional)}. The arguments
 * are kept verbatim (any UTF-8 but NUL: they become argv, never a shell's input). */
static int decode_program(const json_t *obj, wagma_program_spec_t *pr, wagma_api_error_t *err) {
  const char *key;
  json_t *v;
  char f[96];
  int64_t i64;
  int e, has_name = 0;
  if (!json_is_object(obj))
    return wg_api_fail(err, "program", "must be an object: {\"name\": ..., \"args\": [...]}");
  json_object_foreach((json_t *)obj, key, v) {
    wg_api_path(f, sizeof f, "program", key);
    if (strcmp(key, "name") == 0) {
      if ((e = wg_api_str(v, f, pr->name, sizeof pr->name, err)))
        return e;
      if (!wagma_program_name_valid(pr->name))
        return wg_api_fail(err, f, PROGRAM_NAME_RULE);
      has_name = 1;
    } else if (strcmp(key, "args") == 0) {
      size_t i;
      json_t *a;
      if (!json_is_array(v))
        return wg_api_fail(err, f, "must be an array of strings");
      if (json_array_size(v) > WAGMA_API_PROGRAM_ARGS_MAX)
        return wg_api_fail(err, f, "at most %d arguments", WAGMA_API_PROGRAM_ARGS_MAX);
      json_array_foreach(v, i, a) {
        snprintf(f, sizeof f, "program.args[%zu]", i);
        if ((e = wg_api_str(a, f, pr->args[i], sizeof pr->args[i], err)))
          return e;
      }
      pr->nargs = (int)json_array_size(v);
    } else if (strcmp(key, "max_restarts") == 0) {
      if ((e = wg_api_int(v, f, 0, WAGMA_API_PROGRAM_RESTARTS_MAX, &i64, err)))
        return e;
      pr->max_restarts = (int)i64;
    } else {
      return wg_api_fail(err, f, "unknown field");
    }
  }
  if (!has_name)
    return wg_api_fail(err, "program.name", "is required");
  return 0;
}

static int decode_optimizer(const json_t *obj, wagma_optimizer_spec_t *o, int *has_momentum,
                            wagma_api_error_t *err) {
  const char *key;
  json_t *v;
  char f[96];
  int64_t i64;
  int e;
  if (!json_is_object(obj))
    return wg_api_fail(err, "optimizer", "must be an object");
  json_object_foreach((json_t *)obj, key, v) {
    wg_api_path(f, sizeof f, "optimizer", key);
    if (strcmp(key, "type") == 0) {
      int t = 0;
      if ((e = wg_api_enum(v, f, optimizer_names, NELEM(optimizer_names), &t, err)))
        return e;
      o->type = (wagma_optimizer_type_t)t;
    } else if (strcmp(key, "lr") == 0) {
      if ((e = wg_api_num(v, f, 0, 1, 10, 0, &o->lr, err)))
        return e;
    } else if (strcmp(key, "momentum") == 0) {
      if ((e = wg_api_num(v, f, 0, 0, 1, 1, &o->momentum, err)))
        return e;
      *has_momentum = 1;
    } else if (strcmp(key, "nesterov") == 0) {
      if ((e = wg_api_bool(v, f, &o->nesterov, err)))
        return e;
    } else if (strcmp(key, "weight_decay") == 0) {
      if ((e = wg_api_num(v, f, 0, 0, 1, 1, &o->weight_decay, err)))
        return e;
    } else if (strcmp(key, "warmup") == 0) {
      if ((e = wg_api_int(v, f, 0, (int64_t)MAX_ITERATIONS, &i64, err)))
        return e;
      o->warmup = (uint64_t)i64;
    } else {
      return wg_api_fail(err, f, "unknown field");
    }
  }
  return 0;
}

static int decode_checkpoint(const json_t *obj, wagma_checkpoint_spec_t *c,
                             wagma_api_error_t *err) {
  const char *key;
  json_t *v;
  char f[96];
  int e;
  if (!json_is_object(obj))
    return wg_api_fail(err, "checkpoint", "must be an object");
  json_object_foreach((json_t *)obj, key, v) {
    wg_api_path(f, sizeof f, "checkpoint", key);
    if (strcmp(key, "every") == 0) {
      if ((e = wg_api_u64(v, f, MAX_ITERATIONS, &c->every, err)))
        return e;
    } else if (strcmp(key, "path") == 0) {
      if ((e = wg_api_str(v, f, c->path, sizeof c->path, err)))
        return e;
    } else {
      return wg_api_fail(err, f, "unknown field");
    }
  }
  return 0;
}

static int decode_enum_field(const json_t *v, const char *f, const char *const *names, int n,
                             int *out, wagma_api_error_t *err) {
  return wg_api_enum(v, f, names, n, out, err);
}

int wagma_job_spec_from_value(const json_t *root, wagma_job_spec_t *spec, wagma_api_error_t *err) {
  wagma_job_spec_t s;
  const char *key;
  json_t *v;
  int64_t i64;
  int en, e = 0;
  int has_workers = 0, has_min = 0, has_max = 0, has_iter = 0, has_epochs = 0, has_mom = 0;
  int has_model = 0, has_dataset = 0, has_program = 0;
  wagma_job_spec_init(&s);
  if (!json_is_object(root))
    return wg_api_fail(err, "", "must be a JSON object");
  json_object_foreach((json_t *)root, key, v) {
    if (strcmp(key, "name") == 0) {
      if ((e = wg_api_str(v, "name", s.name, sizeof s.name, err)))
        goto out;
      if (!wagma_api_name_valid(s.name)) {
        e = wg_api_fail(err, "name",
                        "must be 1-63 characters of [A-Za-z0-9._-], not starting with '.' or '-'");
        goto out;
      }
    } else if (strcmp(key, "model") == 0) {
      if ((e = decode_enum_field(v, key, model_names, NELEM(model_names), &en, err)))
        goto out;
      s.model = (wagma_model_kind_t)en;
      has_model = 1;
    } else if (strcmp(key, "dataset") == 0) {
      if ((e = decode_enum_field(v, key, dataset_names, NELEM(dataset_names), &en, err)))
        goto out;
      s.dataset = (wagma_dataset_kind_t)en;
      has_dataset = 1;
    } else if (strcmp(key, "algorithm") == 0) {
      if ((e = decode_enum_field(v, key, algorithm_names, NELEM(algorithm_names), &en, err)))
        goto out;
      s.algorithm = (wagma_algorithm_t)en;
    } else if (strcmp(key, "global_sync") == 0) {
      if ((e = decode_enum_field(v, key, sync_names, NELEM(sync_names), &en, err)))
        goto out;
      s.global_sync = (wagma_sync_t)en;
    } else if (strcmp(key, "device") == 0) {
      if ((e = decode_enum_field(v, key, device_names, NELEM(device_names), &en, err)))
        goto out;
      s.device = (wagma_device_t)en;
    } else if (strcmp(key, "workers") == 0) {
      if ((e = wg_api_int(v, key, 1, WAGMA_API_MAX_WORKERS, &i64, err)))
        goto out;
      s.workers = (int)i64;
      has_workers = 1;
    } else if (strcmp(key, "min_workers") == 0) {
      if ((e = wg_api_int(v, key, 1, WAGMA_API_MAX_WORKERS, &i64, err)))
        goto out;
      s.min_workers = (int)i64;
      has_min = 1;
    } else if (strcmp(key, "max_workers") == 0) {
      if ((e = wg_api_int(v, key, 1, WAGMA_API_MAX_WORKERS, &i64, err)))
        goto out;
      s.max_workers = (int)i64;
      has_max = 1;
    } else if (strcmp(key, "group_size") == 0) {
      if ((e = wg_api_int(v, key, 2, 1024, &i64, err)))
        goto out;
      s.group_size = (int)i64;
    } else if (strcmp(key, "staleness_bound") == 0) {
      if ((e = wg_api_int(v, key, 1, 1000000, &i64, err)))
        goto out;
      s.staleness_bound = (int)i64;
    } else if (strcmp(key, "batch_size") == 0) {
      if ((e = wg_api_int(v, key, 1, 65536, &i64, err)))
        goto out;
      s.batch_size = (int)i64;
    } else if (strcmp(key, "iterations") == 0) {
      if ((e = wg_api_int(v, key, 1, (int64_t)MAX_ITERATIONS, &i64, err)))
        goto out;
      s.iterations = (uint64_t)i64;
      has_iter = 1;
    } else if (strcmp(key, "epochs") == 0) {
      if ((e = wg_api_int(v, key, 1, (int64_t)MAX_EPOCHS, &i64, err)))
        goto out;
      s.epochs = (uint64_t)i64;
      has_epochs = 1;
    } else if (strcmp(key, "eval_every") == 0) {
      if ((e = wg_api_u64(v, key, MAX_ITERATIONS, &s.eval_every, err)))
        goto out;
    } else if (strcmp(key, "seed") == 0) {
      if ((e = wg_api_u64(v, key, (uint64_t)INT64_MAX, &s.seed, err)))
        goto out;
    } else if (strcmp(key, "optimizer") == 0) {
      if ((e = decode_optimizer(v, &s.optimizer, &has_mom, err)))
        goto out;
    } else if (strcmp(key, "checkpoint") == 0) {
      if ((e = decode_checkpoint(v, &s.checkpoint, err)))
        goto out;
    } else if (strcmp(key, "ps_shards") == 0) {
      if ((e = wg_api_int(v, key, 1, WAGMA_API_MAX_PS_SHARDS, &i64, err)))
        goto out;
      s.ps_shards = (int)i64;
    } else if (strcmp(key, "dc_adaptive") == 0) {
      if ((e = wg_api_bool(v, key, &s.dc_adaptive, err)))
        goto out;
    } else if (strcmp(key, "dc_lambda") == 0) {
      if ((e = wg_api_num(v, key, 0, 0, 1000, 0, &s.dc_lambda, err)))
        goto out;
    } else if (strcmp(key, "gradient_delay") == 0) {
      if ((e = wg_api_int(v, key, 0, WAGMA_API_MAX_GRADIENT_DELAY, &i64, err)))
        goto out;
      s.gradient_delay = (int)i64;
    } else if (strcmp(key, "program") == 0) {
      if ((e = decode_program(v, &s.program, err)))
        goto out;
      has_program = 1;
    } else {
      e = wg_api_fail(err, key, "unknown field");
      goto out;
    }
  }
  if (!has_workers) {
    e = wg_api_fail(err, "workers", "is required");
    goto out;
  }
  if (has_program && has_model) {
    e = wg_api_fail(err, "model", "a program job has no built-in model: give program or model");
    goto out;
  }
  if (has_program && has_dataset) {
    e = wg_api_fail(err, "dataset",
                    "a program job has no built-in dataset (the program reads its own data): "
                    "give program or dataset");
    goto out;
  }
  if (has_iter && has_epochs) {
    e = wg_api_fail(err, "epochs", "give iterations or epochs, not both");
    goto out;
  }
  if (has_epochs)
    s.iterations = 0;
  if (!has_min)
    s.min_workers = has_max && s.max_workers < s.workers ? s.max_workers : s.workers;
  if (!has_max)
    s.max_workers = s.workers;
  if (!has_mom && (s.optimizer.type == WAGMA_OPT_ADAM || is_async_ps(s.algorithm)))
    s.optimizer.momentum = 0; /* adam ignores it; asgd's pushes already act as momentum */
  if ((e = wagma_job_spec_validate(&s, err)))
    goto out;
  *spec = s;
out:
  return e;
}

/* checkpoint.path names a directory relative to the agent's checkpoint root (the agent
 * confines checkpoints under it): NULL when acceptable, else why not. "" is acceptable (no
 * checkpoints). Refused: an absolute path, an empty, "." or ".." component (so no "//", no
 * leading "./", no trailing '/'), and control characters (below 0x20, 0x7f); a NUL cannot
 * get this far (wg_api_str refuses it). */
static const char *checkpoint_path_problem(const char *path) {
  if (path[0] == '\0')
    return NULL;
  if (path[0] == '/')
    return "must be relative to the agent's checkpoint root (no leading '/')";
  for (const unsigned char *p = (const unsigned char *)path; *p; p++)
    if (*p < 0x20 || *p == 0x7f)
      return "must not contain control characters";
  for (const char *c = path;;) {
    size_t n = strcspn(c, "/");
    if (n == 0)
      return "must not have empty components ('//' or a trailing '/')";
    if ((n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.'))
      return "must not have '.' or '..' components";
    if (c[n] == '\0')
      return NULL;
    c += n + 1;
  }
}

/* A program job's own fields, and what a program cannot do (yet): the asynchronous
 * algorithms (the worker library's wrapper does wagma, allreduce and local-sgd), the built-in
 * trainer's gradient delay line and checkpoints. */
static int program_validate(const wagma_job_spec_t *s, wagma_api_error_t *err) {
  const wagma_program_spec_t *pr = &s->program;
  if (pr->max_restarts < 0 || pr->max_restarts > WAGMA_API_PROGRAM_RESTARTS_MAX)
    return wg_api_fail(err, "program.max_restarts", "must be between 0 and %d",
                       WAGMA_API_PROGRAM_RESTARTS_MAX);
  if (!memchr(pr->name, '\0', sizeof pr->name) ||
      (pr->name[0] && !wagma_program_name_valid(pr->name)))
    return wg_api_fail(err, "program.name", PROGRAM_NAME_RULE);
  if (pr->nargs < 0 || pr->nargs > WAGMA_API_PROGRAM_ARGS_MAX)
    return wg_api_fail(err, "program.args", "at most %d arguments", WAGMA_API_PROGRAM_ARGS_MAX);
  for (int i = 0; i < pr->nargs; i++) {
    char f[48];
    snprintf(f, sizeof f, "program.args[%d]", i);
    if (!memchr(pr->args[i], '\0', sizeof pr->args[i]))
      return wg_api_fail(err, f, "must be at most %d characters", WAGMA_API_PROGRAM_ARG_MAX - 1);
    json_t *utf8 = json_string(pr->args[i]); /* NULL: not UTF-8 (JSON could not carry it) */
    if (!utf8)
      return wg_api_fail(err, f, "must be UTF-8");
    json_decref(utf8);
  }
  if (!pr->name[0]) {
    if (pr->nargs)
      return wg_api_fail(err, "program.name", "is required");
    return 0;
  }
  if (s->algorithm != WAGMA_ALGO_WAGMA && s->algorithm != WAGMA_ALGO_ALLREDUCE &&
      s->algorithm != WAGMA_ALGO_LOCAL_SGD)
    return wg_api_fail(err, "algorithm",
                       "%s is not available for programs yet (adpsgd, asgd and dc-asgd run only "
                       "with a built-in model): a program job takes wagma, allreduce or "
                       "local-sgd",
                       wagma_algorithm_name(s->algorithm));
  if (s->gradient_delay != 0)
    return wg_api_fail(err, "gradient_delay",
                       "must be 0 for a program job (the delay line is the built-in trainer's)");
  if (s->checkpoint.every != 0)
    return wg_api_fail(err, "checkpoint.every",
                       "must be 0 for a program job: the program saves its own checkpoints");
  return 0;
}

int wagma_job_spec_validate(const wagma_job_spec_t *s, wagma_api_error_t *err) {
  if (s->name[0] && !wagma_api_name_valid(s->name))
    return wg_api_fail(err, "name", "invalid name");
  if (s->workers < 1 || s->workers > WAGMA_API_MAX_WORKERS)
    return wg_api_fail(err, "workers", "must be between 1 and %d", WAGMA_API_MAX_WORKERS);
  if (s->min_workers < 1 || s->min_workers > s->workers)
    return wg_api_fail(err, "min_workers", "must be between 1 and workers (%d)", s->workers);
  if (s->max_workers < s->workers || s->max_workers > WAGMA_API_MAX_WORKERS)
    return wg_api_fail(err, "max_workers", "must be between workers (%d) and %d", s->workers,
                       WAGMA_API_MAX_WORKERS);
  if (s->group_size < 2 || s->group_size > 1024)
    return wg_api_fail(err, "group_size", "must be between 2 and 1024");
  if (s->staleness_bound < 1 || s->staleness_bound > 1000000)
    return wg_api_fail(err, "staleness_bound", "must be between 1 and 1000000");
  if (s->batch_size < 1 || s->batch_size > 65536)
    return wg_api_fail(err, "batch_size", "must be between 1 and 65536");
  if ((s->iterations == 0) == (s->epochs == 0))
    return wg_api_fail(err, "iterations", "exactly one of iterations and epochs must be > 0");
  if (s->optimizer.nesterov && !(s->optimizer.momentum > 0))
    return wg_api_fail(err, "optimizer.nesterov", "needs optimizer.momentum > 0");
  if (s->optimizer.type == WAGMA_OPT_ADAM && s->optimizer.nesterov)
    return wg_api_fail(err, "optimizer.nesterov", "applies to sgd only");
  if (!(s->optimizer.lr > 0 && s->optimizer.lr <= 10))
    return wg_api_fail(err, "optimizer.lr", "must be in (0, 10]");
  int e = program_validate(s, err); /* before ps_shards: "asgd is not for programs" first */
  if (e)
    return e;
  if (s->ps_shards < 1 || s->ps_shards > WAGMA_API_MAX_PS_SHARDS)
    return wg_api_fail(err, "ps_shards", "must be between 1 and %d", WAGMA_API_MAX_PS_SHARDS);
  if ((s->algorithm == WAGMA_ALGO_ASGD || s->algorithm == WAGMA_ALGO_DC_ASGD) &&
      s->ps_shards >= s->workers)
    return wg_api_fail(err, "ps_shards", "must be below workers (%d): a job needs a worker",
                       s->workers);
  if (!(s->dc_lambda >= 0 && s->dc_lambda <= 1000))
    return wg_api_fail(err, "dc_lambda", "must be in [0, 1000]");
  if (s->gradient_delay < 0 || s->gradient_delay > WAGMA_API_MAX_GRADIENT_DELAY)
    return wg_api_fail(err, "gradient_delay", "must be between 0 and %d",
                       WAGMA_API_MAX_GRADIENT_DELAY);
  if (s->checkpoint.every > 0 && s->checkpoint.path[0] == '\0')
    return wg_api_fail(err, "checkpoint.path", "is required when checkpoint.every > 0");
  const char *why = checkpoint_path_problem(s->checkpoint.path);
  if (why)
    return wg_api_fail(err, "checkpoint.path", "%s", why);
  return 0;
}

int wagma_job_spec_from_json(const char *json, size_t len, wagma_job_spec_t *spec,
                             wagma_api_error_t *err) {
  int e;
  json_t *root = wg_api_parse_object(json, len, err);
  if (!root)
    return WAGMA_EINVAL;
  e = wagma_job_spec_from_value(root, spec, err);
  json_decref(root);
  return e;
}

json_t *wagma_job_spec_to_value(const wagma_job_spec_t *s) {
  json_t *o = json_object();
  json_t *opt = json_object();
  json_t *ck = json_object();
  if (!o || !opt || !ck) {
    json_decref(o);
    json_decref(opt);
    json_decref(ck);
    return NULL;
  }
  if (s->name[0]) /* "" = not chosen yet; a decoder would reject an empty name */
    json_object_set_new(o, "name", json_string(s->name));
  if (s->program.name[0]) { /* a program job: no model, no dataset */
    json_t *pr = json_object(), *args = json_array();
    int ok = pr && args;
    for (int i = 0; ok && i < s->program.nargs && i < WAGMA_API_PROGRAM_ARGS_MAX; i++) {
      const char *a = s->program.args[i];
      /* NULL when not UTF-8 (wagma_job_spec_validate refuses such a spec) */
      ok = json_array_append_new(args, json_stringn(a, strnlen(a, WAGMA_API_PROGRAM_ARG_MAX))) == 0;
    }
    if (!ok) {
      json_decref(pr);
      json_decref(args);
      json_decref(o);
      json_decref(opt);
      json_decref(ck);
      return NULL;
    }
    json_object_set_new(
        pr, "name",
        json_stringn(s->program.name, strnlen(s->program.name, sizeof s->program.name)));
    json_object_set_new(pr, "args", args);
    json_object_set_new(pr, "max_restarts", json_integer(s->program.max_restarts));
    json_object_set_new(o, "program", pr);
  } else {
    json_object_set_new(o, "model", json_string(wagma_model_name(s->model)));
    json_object_set_new(o, "dataset", json_string(wagma_dataset_name(s->dataset)));
  }
  json_object_set_new(o, "algorithm", json_string(wagma_algorithm_name(s->algorithm)));
  json_object_set_new(o, "workers", json_integer(s->workers));
  json_object_set_new(o, "min_workers", json_integer(s->min_workers));
  json_object_set_new(o, "max_workers", json_integer(s->max_workers));
  json_object_set_new(o, "group_size", json_integer(s->group_size));
  json_object_set_new(o, "staleness_bound", json_integer(s->staleness_bound));
  json_object_set_new(o, "global_sync", json_string(wagma_sync_name(s->global_sync)));
  json_object_set_new(opt, "type", json_string(wagma_optimizer_name(s->optimizer.type)));
  json_object_set_new(opt, "lr", json_real(s->optimizer.lr));
  json_object_set_new(opt, "momentum", json_real(s->optimizer.momentum));
  json_object_set_new(opt, "nesterov", json_boolean(s->optimizer.nesterov));
  json_object_set_new(opt, "weight_decay", json_real(s->optimizer.weight_decay));
  json_object_set_new(opt, "warmup", json_integer((json_int_t)s->optimizer.warmup));
  json_object_set_new(o, "optimizer", opt);
  json_object_set_new(o, "batch_size", json_integer(s->batch_size));
  if (s->epochs)
    json_object_set_new(o, "epochs", json_integer((json_int_t)s->epochs));
  else
    json_object_set_new(o, "iterations", json_integer((json_int_t)s->iterations));
  json_object_set_new(o, "eval_every", json_integer((json_int_t)s->eval_every));
  json_object_set_new(o, "seed", json_integer((json_int_t)s->seed));
  json_object_set_new(o, "device", json_string(wagma_device_name(s->device)));
  json_object_set_new(o, "gradient_delay", json_integer(s->gradient_delay));
  json_object_set_new(o, "ps_shards", json_integer(s->ps_shards));
  json_object_set_new(o, "dc_lambda", json_real(s->dc_lambda));
  json_object_set_new(o, "dc_adaptive", json_boolean(s->dc_adaptive));
  json_object_set_new(ck, "every", json_integer((json_int_t)s->checkpoint.every));
  json_object_set_new(ck, "path", json_string(s->checkpoint.path));
  json_object_set_new(o, "checkpoint", ck);
  return o;
}

/* Asynchronous SGD with W workers pushing is stable only for a small enough step: each push
 * lands on a model that W - 1 others moved since it was pulled, which acts as momentum of
 * about 1 - 1/W on top of the optimizer's (Mitliagkas et al., "Asynchrony begets momentum",
 * 2016). Measured on 4 agents (docs/benchmarks.md, "Per-algorithm defaults"): MLP on
 * Fashion-MNIST, 3 workers pushing, lr 0.05: momentum 0.8 trains (0.86), 0.9 ends at chance
 * (asgd) or diverges (dc-asgd); lr 0.1 with momentum 0.7 reaches 0.44. The rule flags
 * W x lr / (1 - momentum) >= 0.9, which separates those runs, with W the workers pushing at
 * max_workers. */
#define ASYNC_STEP_LIMIT 0.9

int wagma_job_spec_warnings(const wagma_job_spec_t *s, char (*out)[WAGMA_API_WARNING_MAX],
                            int max) {
  int n = 0;
  if (is_async_ps(s->algorithm) && s->optimizer.type == WAGMA_OPT_SGD && n < max) {
    int shards = s->ps_shards < s->max_workers - 1 ? s->ps_shards : s->max_workers - 1;
    int pushing = s->max_workers - (shards > 0 ? shards : 0);
    double step = pushing * s->optimizer.lr / (1.0 - s->optimizer.momentum);
    if (step >= ASYNC_STEP_LIMIT)
      snprintf(out[n++], WAGMA_API_WARNING_MAX,
               "optimizer: %s with %d workers pushing at lr %g and momentum %g is known to "
               "stall at chance accuracy or diverge (workers x lr / (1 - momentum) = %.2f; "
               "below %.1f trains): asynchronous pushes already act as momentum; use "
               "momentum 0 (the default for %s) or a smaller lr",
               wagma_algorithm_name(s->algorithm), pushing, s->optimizer.lr, s->optimizer.momentum,
               step, ASYNC_STEP_LIMIT, wagma_algorithm_name(s->algorithm));
  }
  return n;
}

json_t *wagma_job_spec_warnings_value(const wagma_job_spec_t *spec) {
  char w[WAGMA_API_WARNINGS_MAX][WAGMA_API_WARNING_MAX];
  json_t *a = json_array();
  int n = wagma_job_spec_warnings(spec, w, WAGMA_API_WARNINGS_MAX);
  for (int i = 0; a && i < n; i++)
    json_array_append_new(a, json_string(w[i]));
  return a;
}

int wagma_job_spec_to_json(const wagma_job_spec_t *spec, char **json) {
  json_t *v = wagma_job_spec_to_value(spec);
  int e = wg_api_dump(v, json);
  json_decref(v);
  return e;
}

/* Fields of the spec that exist but cannot change after submission. */
static const char *const immutable_fields[] = {
    "name",        "model",      "dataset",        "algorithm",  "group_size", "staleness_bound",
    "global_sync", "optimizer",  "batch_size",     "iterations", "epochs",     "seed",
    "device",      "checkpoint", "gradient_delay", "ps_shards",  "dc_lambda",  "dc_adaptive",
    "program"};

int wagma_job_patch_from_json(const char *json, size_t len, wagma_job_patch_t *patch,
                              wagma_api_error_t *err) {
  wagma_job_patch_t p;
  const char *key;
  json_t *v;
  int64_t i64;
  int e = 0;
  memset(&p, 0, sizeof p);
  json_t *root = wg_api_parse_object(json, len, err);
  if (!root)
    return WAGMA_EINVAL;
  json_object_foreach(root, key, v) {
    if (strcmp(key, "workers") == 0) {
      if ((e = wg_api_int(v, key, 1, WAGMA_API_MAX_WORKERS, &i64, err)))
        goto out;
      p.workers = (int)i64;
      p.has_workers = 1;
    } else if (strcmp(key, "min_workers") == 0) {
      if ((e = wg_api_int(v, key, 1, WAGMA_API_MAX_WORKERS, &i64, err)))
        goto out;
      p.min_workers = (int)i64;
      p.has_min_workers = 1;
    } else if (strcmp(key, "max_workers") == 0) {
      if ((e = wg_api_int(v, key, 1, WAGMA_API_MAX_WORKERS, &i64, err)))
        goto out;
      p.max_workers = (int)i64;
      p.has_max_workers = 1;
    } else if (strcmp(key, "eval_every") == 0) {
      if ((e = wg_api_u64(v, key, MAX_ITERATIONS, &p.eval_every, err)))
        goto out;
      p.has_eval_every = 1;
    } else {
      int known = 0;
      for (int i = 0; i < NELEM(immutable_fields); i++)
        known |= strcmp(key, immutable_fields[i]) == 0;
      e = wg_api_fail(err, key,
                      known ? "immutable: cannot change after submission" : "unknown field");
      goto out;
    }
  }
  if (!p.has_workers && !p.has_min_workers && !p.has_max_workers && !p.has_eval_every) {
    e = wg_api_fail(err, "",
                    "nothing to change: give workers, min_workers, max_workers or "
                    "eval_every");
    goto out;
  }
  *patch = p;
out:
  json_decref(root);
  return e;
}

int wagma_job_patch_apply(const wagma_job_patch_t *p, wagma_job_spec_t *spec,
                          wagma_api_error_t *err) {
  wagma_job_spec_t s = *spec;
  int e;
  if (p->has_workers)
    s.workers = p->workers;
  if (p->has_min_workers)
    s.min_workers = p->min_workers;
  if (p->has_max_workers)
    s.max_workers = p->max_workers;
  if (p->has_eval_every)
    s.eval_every = p->eval_every;
  /* Name the field the caller changed when the combination is out of range. */
  if (p->has_workers && (s.workers < s.min_workers || s.workers > s.max_workers))
    return wg_api_fail(err, "workers", "must be between min_workers (%d) and max_workers (%d)",
                       s.min_workers, s.max_workers);
  if ((e = wagma_job_spec_validate(&s, err)))
    return e;
  *spec = s;
  return 0;
}
