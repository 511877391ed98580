/*
 * matmul.h - the matrix-product path lists of the kernel table, filled by
 * kernels/dispatch.c, and the lookups dispatch.c answers kernels.h's
 * kernels_matmul_* with (the rest of kernels/matmul.c's contract is in
 * kernels.h). matmul.c never reads the table itself: it is handed the
 * table or one type's entry.
 */
#ifndef LAMINA_KERNELS_MATMUL_H
#define LAMINA_KERNELS_MATMUL_H

#include "kernels/kernels.h"

/* Each type's path list (lm_type_kernels.mm, n_mm) from the kernels the
 * table k now holds: call once they are all in place. */
void kernels_matmul_fill(lm_kernels *k);

/* kernels.h's kernels_matmul_pick, _packs, _scratch_row and _plan on one
 * type's entry e of the table (dispatch.c looks the entry up). */
const lm_mm_path *matmul_list_pick(const lm_type_kernels *e, int n_tok, int64_t cols, bool has_copy);
bool matmul_list_packs(const lm_type_kernels *e);
size_t matmul_list_scratch_row(const lm_type_kernels *e, uint32_t type, int64_t cols);
void matmul_list_plan(lm_mm_plan *pl, const lm_type_kernels *e, const lm_mm_path *p, int n_tok, int tile);

#endif
