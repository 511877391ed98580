/*
 * stop.h - stop strings, and the text a choice holds back while it could
 * still begin one.
 *
 * A stop string ends a choice's text before it: neither it nor anything
 * after it is output. Text is released as the detokenizer produces it, but
 * the longest tail that could still be the start of a stop string waits
 * until the next piece decides it (or the choice ends and it is flushed).
 * So the held text never exceeds the longest stop string (less one byte)
 * plus one piece: stop_text_init sizes it from those two bounds.
 */
#ifndef LAMINA_STOP_H
#define LAMINA_STOP_H

#include <stdbool.h>
#include <stddef.h>

/* A request's stop strings (owned copies). */
typedef struct {
    char **s; /* (n) NUL-terminated, non-empty */
    int n;
    int max_len; /* bytes of the longest */
} stop_set;

/* Copy n strings (each non-empty). 0, or -1 when out of memory (set empty). */
int stop_set_init(stop_set *ss, const char *const *strs, int n);
void stop_set_free(stop_set *ss);

/* One choice's held text. */
typedef struct {
    char *held; /* (cap) released by the detokenizer, not yet output */
    int n, cap;
} stop_text;

/* Room for the longest stop string plus one piece of piece_max bytes.
 * 0, or -1 when out of memory. */
int stop_text_init(stop_text *t, const stop_set *ss, int piece_max);
void stop_text_free(stop_text *t);

/* Append add[0..n_add) (n_add <= piece_max) to the held text, cut at the
 * first stop string, and release into out all but the longest tail that
 * could still begin one; *len gets the bytes released (at most t->cap). True
 * when a stop string matched: out then holds the text before it and the rest
 * is dropped. */
bool stop_scan(const stop_set *ss, stop_text *t, const char *add, int n_add, char *out, size_t *len);

#endif
