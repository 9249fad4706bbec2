/* kv.c — KV and Txn: put, get, range, delete, txn, ping.
 *
 * Owns nothing between calls: each function builds its request on the stack (or in
 * short-lived arrays for txn), runs one wg_etcd_unary and copies the answer into the
 * caller's structs. No threads; safe from any thread. */
#include <stdlib.h>
#include <string.h>

#include "etcd_internal.h"

#define KV_RANGE "/etcdserverpb.KV/Range"
#define KV_PUT "/etcdserverpb.KV/Put"
#define KV_DELETE "/etcdserverpb.KV/DeleteRange"
#define KV_TXN "/etcdserverpb.KV/Txn"

static ProtobufCBinaryData bytes_of(const void *data, size_t len) {
  ProtobufCBinaryData b = {.len = len, .data = (uint8_t *)data};
  return b;
}

static int64_t header_revision(const Etcdserverpb__ResponseHeader *header) {
  return header == NULL ? 0 : header->revision;
}

static int check_key(wagma_etcd_t *etcd, const char *key) {
  if (etcd == NULL)
    return WAGMA_EINVAL;
  if (key == NULL || key[0] == '\0') {
    wg_etcd_set_error(etcd, "etcd: empty key");
    return WAGMA_EINVAL;
  }
  return 0;
}

void wagma_etcd_range_free(wagma_etcd_range_t *range) {
  if (range == NULL)
    return;
  for (size_t i = 0; i < range->n; i++)
    wg_etcd_kv_clear(&range->kvs[i]);
  free(range->kvs);
  memset(range, 0, sizeof *range);
}

/* Copies a RangeResponse into out (zeroed first). On failure out is left empty. */
static int fill_range(wagma_etcd_range_t *out, const Etcdserverpb__RangeResponse *response) {
  memset(out, 0, sizeof *out);
  out->count = response->count;
  out->more = response->more;
  out->revision = header_revision(response->header);
  if (response->n_kvs == 0)
    return 0;
  out->kvs = calloc(response->n_kvs, sizeof *out->kvs);
  if (out->kvs == NULL)
    return WAGMA_ENOMEM;
  for (size_t i = 0; i < response->n_kvs; i++) {
    if (wg_etcd_kv_copy(&out->kvs[i], response->kvs[i]) != 0) {
      wagma_etcd_range_free(out);
      return WAGMA_ENOMEM;
    }
    out->n = i + 1;
  }
  return 0;
}

/* Fills request for key/prefix; *end_owned receives an allocation the caller frees. */
static int set_range(ProtobufCBinaryData *key_field, ProtobufCBinaryData *end_field,
                     const char *key, int prefix, uint8_t **end_owned) {
  size_t end_len = 0;
  *end_owned = NULL;
  *key_field = bytes_of(key, strlen(key));
  if (!prefix)
    return 0;
  if (wg_etcd_prefix_end(key, end_owned, &end_len) != 0)
    return WAGMA_ENOMEM;
  *end_field = bytes_of(*end_owned, end_len);
  return 0;
}

int wagma_etcd_ping(wagma_etcd_t *etcd, int64_t *revision) {
  Etcdserverpb__RangeRequest request = ETCDSERVERPB__RANGE_REQUEST__INIT;
  Etcdserverpb__RangeResponse *response = NULL;
  static const char probe[] = "\0wagma-ping";
  int rc;
  if (etcd == NULL)
    return WAGMA_EINVAL;
  if (etcd->ping_key != NULL)
    request.key = bytes_of(etcd->ping_key, strlen(etcd->ping_key));
  else
    request.key = bytes_of(probe, sizeof probe - 1);
  request.count_only = 1;
  rc = wg_etcd_unary(etcd, KV_RANGE, &request.base, &etcdserverpb__range_response__descriptor,
                     (ProtobufCMessage **)&response, 0, NULL);
  if (rc == 0 && revision != NULL)
    *revision = header_revision(response->header);
  if (response != NULL)
    protobuf_c_message_free_unpacked(&response->base, NULL);
  return rc;
}

static int put_common(wagma_etcd_t *etcd, const char *key, const void *value, size_t value_len,
                      int64_t lease, wagma_etcd_kv_t **prev, int64_t *revision) {
  Etcdserverpb__PutRequest request = ETCDSERVERPB__PUT_REQUEST__INIT;
  Etcdserverpb__PutResponse *response = NULL;
  int rc = check_key(etcd, key);
  if (rc != 0)
    return rc;
  if (value == NULL && value_len > 0) {
    wg_etcd_set_error(etcd, "etcd put %s: NULL value with length %zu", key, value_len);
    return WAGMA_EINVAL;
  }
  if (prev != NULL)
    *prev = NULL;
  request.key = bytes_of(key, strlen(key));
  request.value = bytes_of(value, value_len);
  request.lease = lease;
  request.prev_kv = prev != NULL;
  rc = wg_etcd_unary(etcd, KV_PUT, &request.base, &etcdserverpb__put_response__descriptor,
                     (ProtobufCMessage **)&response, 0, NULL);
  if (rc != 0)
    goto out;
  if (revision != NULL)
    *revision = header_revision(response->header);
  if (prev != NULL && response->prev_kv != NULL) {
    *prev = malloc(sizeof **prev);
    if (*prev == NULL || wg_etcd_kv_copy(*prev, response->prev_kv) != 0) {
      free(*prev);
      *prev = NULL;
      rc = WAGMA_ENOMEM;
    }
  }
out:
  if (response != NULL)
    protobuf_c_message_free_unpacked(&response->base, NULL);
  return rc;
}

int wagma_etcd_put(wagma_etcd_t *etcd, const char *key, const void *value, size_t value_len,
                   int64_t lease, int64_t *revision) {
  return put_common(etcd, key, value, value_len, lease, NULL, revision);
}

int wagma_etcd_put_prev(wagma_etcd_t *etcd, const char *key, const void *value, size_t value_len,
                        int64_t lease, wagma_etcd_kv_t **prev, int64_t *revision) {
  if (prev == NULL)
    return WAGMA_EINVAL;
  return put_common(etcd, key, value, value_len, lease, prev, revision);
}

int wagma_etcd_range(wagma_etcd_t *etcd, const char *key, const wagma_etcd_range_options_t *options,
                     wagma_etcd_range_t *out) {
  Etcdserverpb__RangeRequest request = ETCDSERVERPB__RANGE_REQUEST__INIT;
  Etcdserverpb__RangeResponse *response = NULL;
  wagma_etcd_range_options_t none = {0};
  uint8_t *end = NULL;
  int rc = check_key(etcd, key);
  if (rc != 0)
    return rc;
  if (out == NULL)
    return WAGMA_EINVAL;
  memset(out, 0, sizeof *out);
  if (options == NULL)
    options = &none;
  if (options->limit < 0 || options->revision < 0 || options->min_mod_revision < 0) {
    wg_etcd_set_error(etcd, "etcd range %s: negative limit or revision", key);
    return WAGMA_EINVAL;
  }
  rc = set_range(&request.key, &request.range_end, key, options->prefix, &end);
  if (rc != 0)
    return rc;
  request.limit = options->limit;
  request.revision = options->revision;
  request.keys_only = options->keys_only != 0;
  request.count_only = options->count_only != 0;
  request.min_mod_revision = options->min_mod_revision;
  rc = wg_etcd_unary(etcd, KV_RANGE, &request.base, &etcdserverpb__range_response__descriptor,
                     (ProtobufCMessage **)&response, 0, NULL);
  if (rc == 0)
    rc = fill_range(out, response);
  if (response != NULL)
    protobuf_c_message_free_unpacked(&response->base, NULL);
  free(end);
  return rc;
}

int wagma_etcd_get(wagma_etcd_t *etcd, const char *key, wagma_etcd_kv_t **kv, int64_t *revision) {
  wagma_etcd_range_t range;
  int rc;
  if (kv == NULL)
    return WAGMA_EINVAL;
  *kv = NULL;
  rc = wagma_etcd_range(etcd, key, NULL, &range);
  if (rc != 0)
    return rc;
  if (revision != NULL)
    *revision = range.revision;
  if (range.n == 0) {
    wg_etcd_set_error(etcd, "etcd get %s: no such key", key);
    rc = WAGMA_ENOTFOUND;
  } else {
    *kv = malloc(sizeof **kv);
    if (*kv == NULL) {
      rc = WAGMA_ENOMEM;
    } else {
      **kv = range.kvs[0]; /* take ownership of the first kv's fields */
      memset(&range.kvs[0], 0, sizeof range.kvs[0]);
    }
  }
  wagma_etcd_range_free(&range);
  return rc;
}

int wagma_etcd_delete(wagma_etcd_t *etcd, const char *key, int prefix, int64_t *deleted,
                      int64_t *revision) {
  Etcdserverpb__DeleteRangeRequest request = ETCDSERVERPB__DELETE_RANGE_REQUEST__INIT;
  Etcdserverpb__DeleteRangeResponse *response = NULL;
  uint8_t *end = NULL;
  int rc = check_key(etcd, key);
  if (rc != 0)
    return rc;
  rc = set_range(&request.key, &request.range_end, key, prefix, &end);
  if (rc != 0)
    return rc;
  rc = wg_etcd_unary(etcd, KV_DELETE, &request.base,
                     &etcdserverpb__delete_range_response__descriptor,
                     (ProtobufCMessage **)&response, 0, NULL);
  if (rc == 0) {
    if (deleted != NULL)
      *deleted = response->deleted;
    if (revision != NULL)
      *revision = header_revision(response->header);
  }
  if (response != NULL)
    protobuf_c_message_free_unpacked(&response->base, NULL);
  free(end);
  return rc;
}

/* ---- Txn ---------------------------------------------------------------------------- */

void wagma_etcd_txn_result_free(wagma_etcd_txn_result_t *result) {
  if (result == NULL)
    return;
  for (size_t i = 0; i < result->n; i++)
    wagma_etcd_range_free(&result->results[i].range);
  free(result->results);
  memset(result, 0, sizeof *result);
}

/* Storage for the protobuf form of one op (pointed to by a RequestOp). */
struct op_storage {
  Etcdserverpb__RequestOp op;
  Etcdserverpb__PutRequest put;
  Etcdserverpb__DeleteRangeRequest del;
  Etcdserverpb__RangeRequest range;
  uint8_t *end; /* owned prefix end */
};

static int build_op(wagma_etcd_t *etcd, struct op_storage *s, const wagma_etcd_op_t *op) {
  etcdserverpb__request_op__init(&s->op);
  if (op->key == NULL || op->key[0] == '\0') {
    wg_etcd_set_error(etcd, "etcd txn: op with empty key");
    return WAGMA_EINVAL;
  }
  switch (op->type) {
  case WAGMA_ETCD_OP_PUT:
    if (op->value == NULL && op->value_len > 0) {
      wg_etcd_set_error(etcd, "etcd txn put %s: NULL value", op->key);
      return WAGMA_EINVAL;
    }
    etcdserverpb__put_request__init(&s->put);
    s->put.key = bytes_of(op->key, strlen(op->key));
    s->put.value = bytes_of(op->value, op->value_len);
    s->put.lease = op->lease;
    s->op.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_PUT;
    s->op.request_put = &s->put;
    return 0;
  case WAGMA_ETCD_OP_DELETE:
    etcdserverpb__delete_range_request__init(&s->del);
    s->op.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_DELETE_RANGE;
    s->op.request_delete_range = &s->del;
    return set_range(&s->del.key, &s->del.range_end, op->key, op->prefix, &s->end);
  case WAGMA_ETCD_OP_RANGE:
    etcdserverpb__range_request__init(&s->range);
    s->range.limit = op->limit;
    s->op.request_case = ETCDSERVERPB__REQUEST_OP__REQUEST_REQUEST_RANGE;
    s->op.request_range = &s->range;
    return set_range(&s->range.key, &s->range.range_end, op->key, op->prefix, &s->end);
  }
  wg_etcd_set_error(etcd, "etcd txn: unknown op type %d", (int)op->type);
  return WAGMA_EINVAL;
}

static int build_cmp(wagma_etcd_t *etcd, Etcdserverpb__Compare *c, const wagma_etcd_cmp_t *cmp) {
  etcdserverpb__compare__init(c);
  if (cmp->key == NULL || cmp->key[0] == '\0' || (int)cmp->result < 0 || cmp->result > 3) {
    wg_etcd_set_error(etcd, "etcd txn: bad compare (empty key or unknown result)");
    return WAGMA_EINVAL;
  }
  c->key = bytes_of(cmp->key, strlen(cmp->key));
  c->result = (Etcdserverpb__Compare__CompareResult)cmp->result;
  c->target = (Etcdserverpb__Compare__CompareTarget)cmp->target;
  switch (cmp->target) {
  case WAGMA_ETCD_CMP_VERSION:
    c->target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_VERSION;
    c->version = cmp->number;
    return 0;
  case WAGMA_ETCD_CMP_CREATE:
    c->target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_CREATE_REVISION;
    c->create_revision = cmp->number;
    return 0;
  case WAGMA_ETCD_CMP_MOD:
    c->target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_MOD_REVISION;
    c->mod_revision = cmp->number;
    return 0;
  case WAGMA_ETCD_CMP_VALUE:
    if (cmp->value == NULL && cmp->value_len > 0)
      break;
    c->target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_VALUE;
    c->value = bytes_of(cmp->value, cmp->value_len);
    return 0;
  case WAGMA_ETCD_CMP_LEASE:
    c->target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_LEASE;
    c->lease = cmp->number;
    return 0;
  }
  wg_etcd_set_error(etcd, "etcd txn: bad compare on %s", cmp->key);
  return WAGMA_EINVAL;
}

static int fill_txn(wagma_etcd_txn_result_t *out, const Etcdserverpb__TxnResponse *response) {
  memset(out, 0, sizeof *out);
  out->succeeded = response->succeeded;
  out->revision = header_revision(response->header);
  if (response->n_responses == 0)
    return 0;
  out->results = calloc(response->n_responses, sizeof *out->results);
  if (out->results == NULL)
    return WAGMA_ENOMEM;
  out->n = response->n_responses;
  for (size_t i = 0; i < response->n_responses; i++) {
    const Etcdserverpb__ResponseOp *r = response->responses[i];
    switch (r->response_case) {
    case ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_RANGE:
      out->results[i].type = WAGMA_ETCD_OP_RANGE;
      if (fill_range(&out->results[i].range, r->response_range) != 0) {
        wagma_etcd_txn_result_free(out);
        return WAGMA_ENOMEM;
      }
      break;
    case ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_DELETE_RANGE:
      out->results[i].type = WAGMA_ETCD_OP_DELETE;
      out->results[i].deleted = r->response_delete_range->deleted;
      break;
    default: out->results[i].type = WAGMA_ETCD_OP_PUT; break;
    }
  }
  return 0;
}

int wagma_etcd_txn(wagma_etcd_t *etcd, const wagma_etcd_cmp_t *cmps, size_t n_cmps,
                   const wagma_etcd_op_t *then_ops, size_t n_then, const wagma_etcd_op_t *else_ops,
                   size_t n_else, wagma_etcd_txn_result_t *result) {
  Etcdserverpb__TxnRequest request = ETCDSERVERPB__TXN_REQUEST__INIT;
  Etcdserverpb__TxnResponse *response = NULL;
  Etcdserverpb__Compare *cmp_msgs = NULL, **cmp_ptrs = NULL;
  struct op_storage *ops = NULL;
  Etcdserverpb__RequestOp **op_ptrs = NULL;
  size_t n_ops = n_then + n_else;
  int rc = 0;

  if (etcd == NULL || (n_cmps > 0 && cmps == NULL) || (n_then > 0 && then_ops == NULL) ||
      (n_else > 0 && else_ops == NULL))
    return WAGMA_EINVAL;
  if (result != NULL)
    memset(result, 0, sizeof *result);
  cmp_msgs = calloc(n_cmps + 1, sizeof *cmp_msgs);
  cmp_ptrs = calloc(n_cmps + 1, sizeof *cmp_ptrs);
  ops = calloc(n_ops + 1, sizeof *ops);
  op_ptrs = calloc(n_ops + 1, sizeof *op_ptrs);
  if (cmp_msgs == NULL || cmp_ptrs == NULL || ops == NULL || op_ptrs == NULL) {
    rc = WAGMA_ENOMEM;
    goto out;
  }
  for (size_t i = 0; i < n_cmps; i++) {
    rc = build_cmp(etcd, &cmp_msgs[i], &cmps[i]);
    if (rc != 0)
      goto out;
    cmp_ptrs[i] = &cmp_msgs[i];
  }
  for (size_t i = 0; i < n_ops; i++) {
    rc = build_op(etcd, &ops[i], i < n_then ? &then_ops[i] : &else_ops[i - n_then]);
    if (rc != 0)
      goto out;
    op_ptrs[i] = &ops[i].op;
  }
  request.n_compare = n_cmps;
  request.compare = cmp_ptrs;
  request.n_success = n_then;
  request.success = op_ptrs;
  request.n_failure = n_else;
  request.failure = op_ptrs + n_then;
  rc = wg_etcd_unary(etcd, KV_TXN, &request.base, &etcdserverpb__txn_response__descriptor,
                     (ProtobufCMessage **)&response, 0, NULL);
  if (rc != 0)
    goto out;
  if (result != NULL) {
    rc = fill_txn(result, response);
    if (rc != 0)
      goto out;
  }
  if (!response->succeeded) {
    wg_etcd_set_error(etcd, "etcd txn: compares did not hold (else branch ran)");
    rc = WAGMA_ECONFLICT;
  }
out:
  if (response != NULL)
    protobuf_c_message_free_unpacked(&response->base, NULL);
  for (size_t i = 0; ops != NULL && i < n_ops; i++)
    free(ops[i].end);
  free(ops);
  free(op_ptrs);
  free(cmp_msgs);
  free(cmp_ptrs);
  return rc;
}
