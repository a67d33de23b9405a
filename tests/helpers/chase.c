/* C reference for the Python pointer chase in plugins/module_utils/numa/measure/cost.py.
 *
 * Same method, minus the interpreter: a random single-cycle permutation (Sattolo)
 * of 64-byte lines in an anonymous mapping of BYTES, one 8-byte slot per line
 * holding the slot index of the next line, chased with dependent loads for STEPS
 * steps timed in stretches of CHUNK steps. Prints the fastest stretch and the
 * median stretch in ns per step: "fastest_ns median_ns".
 *
 * Usage: chase BYTES STEPS CHUNK      (compiled by tests/integration/test_cost_c_reference.py)
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#define SLOTS_PER_LINE 8

static uint64_t state = 0x9E3779B97F4A7C15ULL;

static uint64_t next_random(void) {
    /* xorshift64: any decent generator will do, the order only has to defeat prefetchers */
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s BYTES STEPS CHUNK\n", argv[0]);
        return 2;
    }
    size_t bytes = strtoull(argv[1], NULL, 10);
    long steps = strtol(argv[2], NULL, 10);
    long chunk = strtol(argv[3], NULL, 10);
    size_t lines = bytes / 64;
    long chunks = steps / chunk;
    if (lines < 2 || chunk < 1 || chunks < 1) {
        fprintf(stderr, "need BYTES >= 128 and STEPS >= CHUNK >= 1\n");
        return 2;
    }
    uint64_t *slots = mmap(NULL, lines * 64, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint64_t *order = malloc(lines * sizeof(uint64_t));
    double *per_step = malloc(chunks * sizeof(double));
    if (slots == MAP_FAILED || !order || !per_step) {
        perror("allocation");
        return 1;
    }
    for (size_t k = 0; k < lines; k++)
        order[k] = k * SLOTS_PER_LINE;
    for (size_t top = lines - 1; top > 0; top--) {
        size_t other = next_random() % top;
        uint64_t swap = order[top];
        order[top] = order[other];
        order[other] = swap;
    }
    for (size_t k = 0; k < lines; k++)
        slots[k * SLOTS_PER_LINE] = order[k];
    free(order);

    volatile uint64_t *chain = slots; /* volatile: every load happens, in order */
    uint64_t index = 0;
    for (long c = 0; c < chunks; c++) {
        double begin = now();
        for (long s = 0; s < chunk; s++)
            index = chain[index];
        per_step[c] = (now() - begin) / chunk * 1e9;
    }
    qsort(per_step, chunks, sizeof(double), by_value);
    printf("%.2f %.2f\n", per_step[0], per_step[chunks / 2]);
    return index == (uint64_t)-1; /* uses index so the chase cannot be optimised away */
}
