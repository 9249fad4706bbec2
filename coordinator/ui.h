/* coordinator/ui.h — the web view (ui.c): HTML, JS and CSS compiled in (coordinator/ui/). */
#ifndef WAGMA_COORD_UI_H
#define WAGMA_COORD_UI_H

#include <stddef.h>

#include "request.h"
#include "router.h"

/* The files, generated from coordinator/ui/ by cmake/WagmaEmbed.cmake (ui_assets.c). */
typedef struct wg_ui_file {
  const char *name; /* path under /ui/ */
  const char *type; /* Content-Type */
  const unsigned char *data;
  size_t len;
} wg_ui_file_t;
extern const wg_ui_file_t wg_ui_files[];
extern const int wg_ui_nfiles;
/* The file of route->asset, or the redirect of "/": a static body. */
void wg_h_ui(const wg_route_t *r, wg_response_t *res);
/* The index of a file of the web view by its path under /ui/ ("" = index.html), or -1. */
int wg_ui_asset(const char *name);

#endif
