/* io.h — reading expert records: direct I/O where the filesystem allows it,
 * and reader threads that spend their lives in pread so that reads overlap
 * compute.
 *
 * A job reads `size` bytes at `offset` of `fd` into `buf`. Jobs are queued
 * with fe_io_submit and waited for with fe_io_wait; all of one engine's jobs
 * share one queue and one completion signal.
 *
 * The readers share the job at the head of the queue in pieces of
 * FE_IO_CHUNK bytes (a K3 record is 12.18 MiB: three pieces and a bit), so
 * jobs complete in the order they were queued, each as soon as the disk has
 * brought its bytes at the full queue depth, instead of every reader
 * finishing its own whole record at about the same time, n_readers records
 * late: the compute starts on the first record of a layer after one
 * record's read, not n_readers records' (bench/stream.py --true-shape).
 * A single reader reads whole jobs.
 *
 * How many pieces are read at once (the queue depth, 1..n_readers) is
 * measured, not assumed: a deeper queue pays only on a disk that serves
 * concurrent reads faster than one at a time (an Apple SSD does; this
 * project's virtio test disk barely does, and there each of 8 concurrent
 * reads took 2-3x as long as each of 2, so the read a layer waits for landed
 * later). fe_io_depth_step (below) hill-climbs over the depths 1, 2, 4, ...
 * n_readers on the read rate the disk gives while busy. The depth limits
 * jobs of one piece (a record up to FE_IO_CHUNK: the Kimi-Linear bench's
 * 152 KB); the pieces of a larger job are read at every reader's depth, as
 * before (K3's 12 MB records: under other jobs' load the climb's depth 2-4
 * decoded 15-35 % slower there than 8, bench log session 19 h3). */
#ifndef FERRY_IO_H
#define FERRY_IO_H

#include <pthread.h>
#include <stdint.h>

#include "common.h"
#include "pool.h"

typedef struct fe_io_job {
    int fd;                  /* file to read */
    uint8_t *buf;            /* destination, 4096-aligned */
    uint64_t size;           /* bytes */
    uint64_t offset;         /* file offset */
    int done;                /* set by a reader when finished (guarded by the io mutex) */
    int err_no;              /* errno of a failed read, or -1 for a short read, 0 if fine */
    uint64_t got;            /* bytes actually read */
    double seconds;          /* time the read took */
    int urgent;              /* queued ahead of non-urgent jobs (guarded by the io mutex) */
    int background;          /* a background job (FE_IO_BACKGROUND), not urgent (guarded by the io mutex) */
    uint64_t crc_from;       /* with crc_len > 0: after a complete read the reader computes */
    uint64_t crc_len;        /* the CRC32 of buf[crc_from, crc_from + crc_len) into crc, */
    uint32_t crc;            /* so a record's check runs on its reader, beside the compute */
    struct fe_io_job *next;  /* queue link */
    uint64_t claimed;        /* bytes handed to readers so far (guarded by the io mutex) */
    int inflight;            /* pieces being read (guarded by the io mutex) */
    double started;          /* when its first piece was taken */
    int measured;            /* counted in the depth's measured rate while it waits (guarded by the io mutex) */
} fe_io_job;

/* Bytes of a job one reader reads at a time (a multiple of 4096, as direct I/O needs). */
#define FE_IO_CHUNK ((uint64_t)4 << 20)

typedef struct fe_io fe_io;

/* The queue depth's hill climb, one step per epoch of FE_IO_EPOCH pieces
 * read (the fill's background pieces are not counted: they run one at a
 * time whatever the depth). Each depth keeps a running mean of the bytes a
 * second the disk gave while reads were waiting for it (queued or in
 * flight); the climb moves to the
 * next shallower depth when that gives at least 1/FE_IO_DEEPER_GAIN of this
 * one's rate (then each read lands sooner, and the reads a layer waits for
 * queue ahead of the lookahead's instead of sharing the disk with them), and
 * to the next deeper one when that gives FE_IO_DEEPER_GAIN times this one's;
 * every FE_IO_PROBE epochs at one depth it tries a neighbour for an epoch, so
 * a rate measured under other load is not kept for ever. Starts at the
 * deepest (every reader). Timing only: which bytes are read never changes. */
#define FE_IO_MAX_LEVELS 8
#define FE_IO_EPOCH 32
#define FE_IO_PROBE 12
#define FE_IO_DEEPER_GAIN 1.15
typedef struct fe_io_depth {
    int n;                           /* depths to choose from */
    int level[FE_IO_MAX_LEVELS];     /* 1, 2, 4, ..., n_readers */
    double rate[FE_IO_MAX_LEVELS];   /* running mean bytes/s at each, 0 = not measured yet */
    int at;                          /* the current one's index */
    int stay;                        /* epochs at it since the last move or probe */
    int probing;                     /* index it came from, while an epoch tries a neighbour; else -1 */
    int probe_up;                    /* the next probe tries the deeper neighbour */
} fe_io_depth;
void fe_io_depth_init(fe_io_depth *d, int n_readers);
/* Record one epoch's rate at the current depth and choose the next depth (returned). */
int fe_io_depth_step(fe_io_depth *d, double rate);
/* The queue depth now (pieces read at once). */
int fe_io_queue_depth(fe_io *io);

/* Reader threads (n >= 1). NULL when threads cannot be started. */
fe_io *fe_io_new(int n_readers);
/* The readers' own work (pool.h): each piece's read and CRC between begin and end. */
const fe_own_work *fe_io_own_work(const fe_io *io);
void fe_io_free(fe_io *io);

/* Queue a job (the caller owns it and must not touch it until it is done).
 * An urgent job (urgent > 0: a read the compute is about to wait for) goes
 * ahead of every queued non-urgent one (speculative prefetches). A
 * background job (urgent = FE_IO_BACKGROUND: the cache's fill) queues as a
 * non-urgent one but starts only while no other background job and no
 * urgent one is being read: one sequential stream that leaves the disk to
 * the reads the compute waits for (with one reader thread it just runs). */
#define FE_IO_BACKGROUND (-1)
void fe_io_submit(fe_io *io, fe_io_job *job, int urgent);
/* Make a queued non-urgent job urgent (the compute now needs it); no effect
 * once a reader has taken it. */
void fe_io_promote(fe_io *io, fe_io_job *job);
/* Take a job back if no reader has started it; returns 1 if it was taken
 * back (it will not run), 0 if it is running or done (wait for it). */
int fe_io_cancel(fe_io *io, fe_io_job *job);
/* Block until the job is done. */
void fe_io_wait(fe_io *io, fe_io_job *job);
/* Block until any job completes after this call's snapshot; returns at once
 * if `job` is already done. */
int fe_io_is_done(fe_io *io, fe_io_job *job);
void fe_io_wait_any(fe_io *io, unsigned *seen_completions);
/* Jobs completed so far (wraps): the snapshot fe_io_wait_any takes, read
 * before checking which jobs are done, so a completion after the check is
 * not missed. */
unsigned fe_io_completions(fe_io *io);

/* Open `path` for reading expert records bypassing the page cache
 * (O_DIRECT on Linux, F_NOCACHE on macOS), checked with one aligned read of
 * `probe_size` bytes at `probe_offset`. Returns the fd and sets *direct to 1,
 * or falls back to a plain buffered fd with *direct = 0 and `why` saying why.
 * Opened O_NONBLOCK (never waiting on a FIFO): the caller checks it is the
 * bank it validated and clears the flag. */
int fe_io_open_records(const char *path, uint64_t probe_offset, uint64_t probe_size, int want_direct,
                       int *direct, char *why, size_t why_len);

#endif
