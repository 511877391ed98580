/*
 * convert.h - importing llama2.c checkpoints (Karpathy's run.c, legacy
 * version 0 export) into GGUF.
 *
 * The checkpoint, in prose (native little-endian, no magic):
 *   7 x int32: dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
 *   seq_len. A negative vocab_size means the classifier is stored separately
 *   at the end of the file; a positive one means it is tied to the token
 *   embedding. Then float32 arrays, each weight matrix row-major with one
 *   row per output (so its GGUF ne[0] is the input dimension):
 *     token_embedding_table (vocab, dim)     rms_att_weight (layer, dim)
 *     wq (layer, n_heads*hs, dim)            wk, wv (layer, n_kv_heads*hs, dim)
 *     wo (layer, dim, n_heads*hs)            rms_ffn_weight (layer, dim)
 *     w1, w3 (layer, hidden, dim)            w2 (layer, dim, hidden)
 *     rms_final_weight (dim)                 freq_cis_real, freq_cis_imag
 *     (seq_len, hs/2) each, not needed       wcls (vocab, dim) if not tied
 *   with hs = dim / n_heads. The file must be exactly that long.
 * The tokenizer: int32 max_token_length, then vocab_size times
 *   { float32 score, int32 len, len bytes of piece }.
 *
 * The GGUF written has the tensor names, shapes, order, metadata keys and
 * token conventions of llama.cpp's llama2.c converter, so the weights are
 * byte-for-byte those of the checkpoint (Q and K are not permuted: llama2.c
 * rotates adjacent pairs, as GGUF llama models do). Tokens: id 0 becomes
 * "<unk>" (unknown), 1 "<s>" and 2 "</s>" (control; llama2.c stores them as
 * "\n<s>\n" and "\n</s>\n"), "<0xXX>" pieces are byte tokens, an empty piece
 * is a control token, every other piece is normal with ' ' written as
 * U+2581. `llama.context_length` is the checkpoint's seq_len, the length the
 * model was trained for (and the size of its RoPE table); no
 * rope.freq_base is written, llama2.c uses the default 10000.
 *
 * Every size is checked against the file sizes with overflow-safe
 * arithmetic before anything is allocated; the checkpoint is mapped, not
 * read, so memory use is independent of the model size.
 */
#ifndef LAMINA_CONVERT_H
#define LAMINA_CONVERT_H

#include <stddef.h>

/* Convert model_bin + tokenizer_bin into out_gguf (which must not be one of
 * the inputs). Returns 0, or -1 with a message in err. Inputs are fully
 * validated before out_gguf is created. out_gguf is written to a temporary
 * file beside it and renamed into place only when complete (base/safefile.h):
 * if writing fails, only the temporary file is removed and out_gguf is
 * untouched; a directory, device or FIFO as out_gguf is refused. */
int convert_llama2c(const char *model_bin, const char *tokenizer_bin, const char *out_gguf, char *err, size_t errlen);

#endif
