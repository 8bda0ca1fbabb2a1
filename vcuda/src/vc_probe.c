/* The probe of a MIG instance the container shares with other containers
 * while it has not learnt its share of it (GPM gives one figure for the whole
 * instance, no per-process one): the container's launches are held for a
 * moment, and the instance's figure during the hold is what the others use.
 * This file owns starting a probe (from gpm_shared() in vc_sample.c), its
 * steps (instead of a controller step while it runs), learning the
 * container's share from what it found, ending it (with a jittered delay
 * before the next one), and letting go of a hold whose prober stopped. Its
 * state is the probe fields of struct vc_throttle (shared by the container's
 * processes); its GPM figures come from vc_sample.c. */
#define _GNU_SOURCE
#include "vc_throttle_int.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <unistd.h>

#include "vc_log.h"

#define PROBE_DRAIN_NS 20000000ull      /* probe: launches held this long before the baseline sample */
#define PROBE_MAX_NS 1000000000ull      /* probe: given up after 1 s (the container launches again) */
#define PROBE_RETRY_NS 300000000ull     /* a probe that taught nothing: again in 0.3-1.5 s, the delay doubling */
#define PROBE_RETRY_STEPS 2             /* ... for each one in a row that taught nothing, up to 1.2-6 s */
#define PROBE_RELEARN_NS 1000000000ull  /* the others' use known, the container's share not: again in 1-2 s */
#define PROBE_ABANDON_NS 2000000000ull  /* a probe still holding launches after 2 s is ended by whoever waits */
#define IDLE_MAX 50                     /* per mille: others below this in a probe may be probing too */
#define LEARN_MIN 50                    /* per mille: the least rest of the figure a share is learnt from */
#define PROBE_BIAS 1.1                  /* a share learned by a probe is taken this much larger */
#define CHECK_STEP 2                    /* a probe's share is checked on the 2nd figure after it (see below) */
#define STEADY_TOL 60                   /* per mille: a probe starts after 2 figures moving less than this */
#define CHECK_TOL 40                    /* per mille, plus a tenth of the expected figure: that check's tolerance */

/* What the container's share leaves of the instance, x1000: the most the
 * others can use beside it while it uses its share. */
static uint64_t rest_of_instance(void)
{
    int target = vc_throttle_share_x1000();
    return target < 1000 ? 1000 - (uint64_t)target : 0;
}

/* base + a pseudo-random part of span (differs between processes and calls). */
static uint64_t jitter(uint64_t base, uint64_t span)
{
    uint64_t x = now_ns() ^ ((uint64_t)getpid() << 32);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return base + (span ? x % span : 0);
}

/* A GPM figure of this process whose whole window lies in the probe's hold
 * (after the drain): 0 with it; 1 when its window reaches back before that
 * (its previous sample was taken by this process outside the probe, and may
 * include the container's own work: the new sample is its baseline). Else
 * vc_sample_gpm()'s answer. */
static int held_util(int s, uint64_t now, uint64_t began, uint64_t *fig)
{
    int rc = vc_sample_gpm(s, now, fig);
    return rc == 0 && vc_sample_gpm_window(s) < began + PROBE_DRAIN_NS ? 1 : rc;
}

/* Start a probe (from gpm_shared() in vc_sample.c) when one is due: the
 * container launches (or waits to), the last one ended long enough ago, and
 * the instance's figure held within STEADY_TOL over the last two steps. A
 * figure that just dropped is mostly a neighbour pausing for its own probe
 * (two probes at once both find the others idle, and teach nothing); one
 * that just rose, a neighbour coming back from one (its use still moves, and
 * the figure before this probe's pause would not be what it uses beside
 * this container). probe_ns is written before the phase, so
 * vc_probe_abandon() never judges a new probe by an old start. */
void vc_probe_start(struct vc_throttle *t, uint64_t now, uint64_t card, double spent_rate)
{
    uint64_t last = atomic_exchange(&t->card_last, card);
    uint32_t steady = (card > last ? card - last : last - card) <= STEADY_TOL ? atomic_load(&t->card_steady) + 1 : 0;
    atomic_store(&t->card_steady, steady);
    if ((spent_rate <= 0 && !atomic_load(&t->throttled)) || now < atomic_load(&t->probe_next_ns) ||
        atomic_load(&t->probe) != 0 || steady < 2)
        return;
    atomic_store(&t->probe_pre, card);
    /* Learnt from only if the rate was settled: a moving one runs ahead of GPM's figure, which lags it. */
    atomic_store(&t->probe_pre_settled, atomic_load(&t->settled) >= SETTLED_STEPS);
    atomic_store(&t->probe_pre_rate, spent_rate > 0 && spent_rate < 1e18 ? (uint64_t)spent_rate : 0);
    atomic_store(&t->probe_ns, now);
    uint32_t none = 0;
    if (atomic_compare_exchange_strong(&t->probe, &none, 1)) {
        atomic_store(&t->tokens, VC_PROBE_HOLD); /* hold the container's launches */
        VC_DEBUG("others run in the MIG instance: probing what they use");
    }
}

/* What a probe's figure of the others' use (fig) teaches of the container's
 * share: the instance's figure just before the pause minus theirs was its
 * own, at the rate it spent then. That window lies before the pause, so a
 * neighbour's reaction to the pause cannot distort it (a neighbour that
 * reacts makes the two figures of the pause differ, and teaches nothing).
 * Learnt only from a rest well above the figures' noise (a few points) and
 * at least half the container's share (a rate still climbing runs ahead of
 * GPM's figure; a share learnt from 3 % of the instance once held a 30 %
 * container at 9 %). fig is the later of the pause's two figures. Taken 10 % high (and learnt once: probes stop then): a share
 * learnt too large holds the container a little below its limit, one learnt
 * too small would let it above. */
static void probe_learn(struct vc_throttle *t, uint64_t fig)
{
    uint64_t pre = atomic_load(&t->probe_pre), rate = atomic_load(&t->probe_pre_rate);
    /* A neighbour that climbs on the pause has climbed by its first figure
     * too: what it used before the pause is taken back along that trend. */
    uint64_t first = atomic_load(&t->probe_first);
    fig = fig > first ? (2 * first > fig ? 2 * first - fig : 0) : fig;
    uint64_t share = (uint64_t)vc_throttle_share_x1000();
    uint64_t least = share / 2 > LEARN_MIN ? share / 2 : LEARN_MIN;
    uint64_t mine = pre > fig ? pre - fig : 0;
    if (rate == 0 || mine < LEARN_MIN || mine > 950)
        return; /* nothing to learn from: an earlier guess stays (dropping it once let a 30 % container run at
                   70-90 % while its neighbour yielded) */
    double k = (double)mine / 1000.0 / (double)rate * PROBE_BIAS;
    atomic_store(&t->guess_x1e12, (uint64_t)(k * 1e12)); /* a floor for the estimate meanwhile, see gpm_shared() */
    if (!atomic_load(&t->probe_pre_settled) || mine < least)
        return;
    atomic_store(&t->pending_others, fig);
    atomic_store(&t->pending_steps, 0);
    atomic_store(&t->pending_x1e12, (uint64_t)(k * 1e12)); /* taken once vc_probe_check() agrees */
    VC_DEBUG("a probe found %.1f%% of the MIG instance the container's own at %" PRIu64 " units/s", mine / 10.0,
             rate);
}

/* After a failed probe (or a share its check refused): the next one waits
 * 0.3-1.5 s, twice that after two such probes in a row, and so on up to
 * 1.2-6 s (a neighbour probing at the same moment, or one whose use moves,
 * is not met again at once; a container whose probes keep failing pauses
 * less and less often). */
static void retry_later(struct vc_throttle *t, uint64_t now)
{
    uint32_t n = atomic_load(&t->probe_fails);
    if (n < PROBE_RETRY_STEPS)
        atomic_store(&t->probe_fails, n + 1);
    uint64_t base = PROBE_RETRY_NS << (n < PROBE_RETRY_STEPS ? n : PROBE_RETRY_STEPS);
    atomic_store(&t->probe_next_ns, now + jitter(base, base * 4));
}

/* A share a probe found is taken only if the instance's figure after the
 * pause agrees with it: the container's own use at what it spends now (by
 * that share) plus the others' figure of the pause. The probe compared the
 * figure before the pause with the one during it; a neighbour whose use
 * moved between the two (it was pausing for its own probe just before, or
 * climbing back from one) makes that difference too small, a share learnt
 * too small, and the container above its limit (a 50 % container ran at
 * 60-63 % so). Such a neighbour is still off its earlier figure after the
 * pause: the figure then differs from the expected one, and the share is
 * refused as a failed probe would be. Called with each new figure while the
 * share is unknown; checks the CHECK_STEP-th after the pause (the first has
 * the container's own launches coming back). */
void vc_probe_check(struct vc_throttle *t, uint64_t now, uint64_t card, double spent_rate)
{
    uint64_t k12 = atomic_load(&t->pending_x1e12);
    if (k12 == 0 || atomic_fetch_add(&t->pending_steps, 1) + 1 < CHECK_STEP)
        return;
    atomic_store(&t->pending_x1e12, 0);
    double k = (double)k12 / 1e12;
    double expect = k / PROBE_BIAS * spent_rate * 1000.0 + (double)atomic_load(&t->pending_others);
    double diff = (double)card > expect ? (double)card - expect : expect - (double)card;
    if (spent_rate <= 0 || diff > CHECK_TOL + expect / 10.0) {
        VC_DEBUG("the MIG instance's figure after the probe is %.1f%%, not the %.1f%% its share predicts: "
                 "probing again later", card / 10.0, expect / 10.0);
        retry_later(t, now);
        return;
    }
    atomic_store(&t->unit_x1e12, k12); /* called only while the share is unknown (gpm_shared()): nothing to blend */
    VC_DEBUG("the MIG instance's figure after the probe is %.1f%% (%.1f%% expected): the share is learnt",
             card / 10.0, expect / 10.0);
}

/* End a probe found in `phase`, unless another process ended it first. fig:
 * the second of the others' two steady figures, or UINT64_MAX when the probe
 * taught nothing (then the next one waits as retry_later() says). low: the
 * least the others' figures of the pause suggest (see vc_probe_step()), or
 * UINT64_MAX with no figure at all (a probe given up, or ended by another
 * process): it replaces what the container takes as the others' use, so the
 * rest of the instance's figure counts as its own. Launches go on from a
 * clean account of what was spent. */
static void probe_end(struct vc_throttle *t, uint64_t now, uint32_t phase, uint64_t fig, uint64_t low)
{
    if (phase == 0 || phase == VC_PROBE_ENDING || !atomic_compare_exchange_strong(&t->probe, &phase, VC_PROBE_ENDING))
        return;
    atomic_store(&t->probe_ns, now); /* when its end began (see vc_probe_abandon()) */
    if (low != UINT64_MAX) {
        atomic_store(&t->others_idle, low);
        atomic_store(&t->others_idle_ns, now);
        atomic_store(&t->est_rate, 0); /* a new figure: the estimate starts from it */
    }
    if (fig != UINT64_MAX) {
        probe_learn(t, fig);
        atomic_store(&t->probe_fails, 0);
        /* only if the share is still unknown then */
        atomic_store(&t->probe_next_ns, now + jitter(PROBE_RELEARN_NS, PROBE_RELEARN_NS));
    } else {
        retry_later(t, now);
    }
    atomic_store(&t->tokens, 0);
    atomic_store(&t->ctrl_added, atomic_load(&t->added));
    atomic_store(&t->ctrl_tokens, 0);
    atomic_store(&t->ctrl_ok_ns, now);
    atomic_store(&t->throttled, 0);
    uint32_t ending = VC_PROBE_ENDING;
    atomic_compare_exchange_strong(&t->probe, &ending, 0); /* unless vc_probe_abandon() let it go meanwhile */
}

/* A probe still holding the container's launches PROBE_ABANDON_NS after it
 * began: the process running it is stopped (SIGSTOP, a debugger) and no
 * other process of the container can step the controller in its place (none
 * has NVML), or it stopped between starting a probe and holding the launches.
 * Whoever waits for tokens ends it (as a probe that taught nothing), and the
 * launches go on at the rate last set: the bucket keeps refilling from the
 * launch accounting while nobody measures. A hold with no probe at all (its
 * starter stopped half-way and the probe was ended meanwhile) is let go too,
 * and so is an end begun 2 s ago and never finished (the process ending it
 * stopped or died between two stores: the phase would say "ending" for good,
 * hold every launch and stop the controller for the container's life).
 * Called by every waiting launch and by each process's watcher: two loads when
 * no probe runs. */
void vc_probe_abandon(struct vc_throttle *t, uint64_t now)
{
    uint32_t phase = atomic_load_explicit(&t->probe, memory_order_relaxed);
    if (phase == 0) {
        int64_t cur = atomic_load_explicit(&t->tokens, memory_order_relaxed);
        if (cur < VC_PROBE_HOLD / 2)
            atomic_compare_exchange_strong(&t->tokens, &cur, 0);
        return;
    }
    uint64_t began = atomic_load(&t->probe_ns);
    if (now < began || now - began < PROBE_ABANDON_NS)
        return;
    if (phase == VC_PROBE_ENDING) {
        if (atomic_compare_exchange_strong(&t->probe, &phase, 0)) /* its hold: by the next call, as above */
            VC_DEBUG("a probe's end was begun %.1f s ago and never finished: let go", (double)(now - began) / 1e9);
        return;
    }
    VC_DEBUG("a probe has held the launches for %.1f s (its process is stopped?): ended, launches go on",
             (double)(now - began) / 1e9);
    probe_end(t, now, phase, UINT64_MAX, UINT64_MAX);
}

/* The probe of a container sharing a MIG instance with no learned share
 * (started by gpm_shared()): its launches are held (PROBE_DRAIN_NS for what
 * is queued to finish), a GPM baseline is taken, and the next two samples'
 * figures are what the others use. Then the launches go on. Returns 1 while
 * the probe runs (no controller step), 0 when there is none. */
int vc_probe_step(int s, struct vc_throttle *t, uint64_t now)
{
    uint32_t phase = atomic_load(&t->probe);
    if (phase == 0)
        return 0;
    if (phase == VC_PROBE_ENDING)
        return 1;
    uint64_t began = atomic_load(&t->probe_ns);
    uint64_t fig = 0;
    if (now - began > PROBE_MAX_NS) {
        probe_end(t, now, phase, UINT64_MAX, UINT64_MAX); /* give up: go on as without a probe, try again later */
        return 1;
    }
    if (phase == 1) {
        if (now - began < PROBE_DRAIN_NS)
            return 1;
        vc_sample_gpm_forget(s); /* what this process sampled before includes the container's own work */
        if (vc_sample_gpm(s, now, &fig) == 1)
            atomic_compare_exchange_strong(&t->probe, &phase, 2);
        return 1;
    }
    if (held_util(s, now, began, &fig) != 0)
        return 1; /* no figure yet (or this process has no baseline): next step */
    if (phase == 2) {
        atomic_store(&t->probe_first, fig); /* the first figure; a second one must agree */
        atomic_compare_exchange_strong(&t->probe, &phase, 3);
        return 1;
    }
    /* The others' figure must be steady over two samples: a neighbour whose
     * limiter reacts to this pause would make it look larger than their use.
     * It must leave this container its share: others that fill what it leaves
     * while it pauses (they climb on its absence) show what they can take,
     * not what they use beside it. And others idle while their processes are
     * there may be probing at the same moment. None of these is a figure to
     * learn a share from: again later, at a time of this container's own.
     * But every one but the third replaces what the container takes as
     * the others' use with the least it suggests (either figure, the first
     * taken back along a climb): what they used long ago is no figure to steer by when they have since
     * yielded (a 30 % container ran at 70-90 % of the instance for seconds,
     * while its neighbour, which had no figure of the others and took the
     * whole instance's for its own, yielded to it), and the least keeps the
     * error on the side of the limit: at worst the container counts the
     * neighbours' use as its own until its next probe, 0.3-1.5 s later. */
    uint64_t first = atomic_load(&t->probe_first);
    uint64_t diff = first > fig ? first - fig : fig - first;
    int steady = diff <= 50 && fig >= IDLE_MAX && first <= rest_of_instance() && fig <= rest_of_instance();
    uint64_t low = fig > first ? (2 * first > fig ? 2 * first - fig : 0) : fig;
    if (first > rest_of_instance() || fig > rest_of_instance())
        low = UINT64_MAX; /* they climbed into this pause: nothing says what they use beside it */
    VC_DEBUG("slot %d: the others use %.1f%% then %.1f%% of the MIG instance%s", s, first / 10.0, fig / 10.0,
             steady ? "" : " (not steady: again later)");
    probe_end(t, now, phase, steady ? fig : UINT64_MAX, steady ? (first < fig ? first : fig) : low);
    return 1;
}
