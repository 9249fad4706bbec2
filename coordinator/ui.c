/* coordinator/ui.c — the web view's files: looked up by name (router.c) and answered from the
 * byte arrays compiled in from coordinator/ui/ (ui_assets.c, cmake/WagmaEmbed.cmake), so the
 * page works offline and needs no file on disk. GET / redirects to /ui/. Pure; thread-safe. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "request.h"
#include "router.h"
#include "ui.h"

int wg_ui_asset(const char *name) {
  if (!name)
    return -1;
  if (!name[0])
    name = "index.html";
  for (int i = 0; i < wg_ui_nfiles; i++)
    if (strcmp(wg_ui_files[i].name, name) == 0)
      return i;
  return -1;
}

void wg_h_ui(const wg_route_t *r, wg_response_t *res) {
  if (!res->static_body)
    free(res->body);
  if (r->asset < 0 || r->asset >= wg_ui_nfiles) {
    res->status = 302;
    snprintf(res->location, sizeof res->location, "/ui/");
    res->body = (char *)"";
    res->static_body = 1;
    res->body_len = 0;
    res->content_type = "text/plain; charset=utf-8";
    return;
  }
  const wg_ui_file_t *f = &wg_ui_files[r->asset];
  res->status = 200;
  res->body = (char *)f->data;
  res->body_len = f->len;
  res->static_body = 1;
  res->content_type = f->type;
  res->cache_control = "no-cache";
}
