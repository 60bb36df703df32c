"""A decode server in miniature: load a tuned bundle at start-up, say what was loaded, decode with it.

    TUNECTL_BUNDLE=/bundles/quickstart@stable python deploy/serving/serve.py --steps 16

``TUNECTL_BUNDLE`` names the bundle: a directory, a ``.tar.gz`` from ``tunectl bundle pack``, a URI
(read through ``tunectl.store.stores.fetch``, which needs pyarrow), or ``STORE/NAME@CHANNEL``.
``TUNECTL_ENV_POLICY`` is ``strict``, ``warn`` (default) or ``off``. Under ``strict`` a bundle that
is bad or was tuned elsewhere stops the server before it takes traffic (exit 3); otherwise the
server logs why and decodes with the kernel's defaults: a bad bundle never takes serving down.

Each step serves one batch of decode requests with the CPU split-KV paged decode kernel
(``tunectl.tasks.decode_attention``): it looks the shape up (no I/O: the tables are in memory), turns the
entry into the kernel's arguments with ``tunectl.runtime.adapters``, and runs the kernel.

``--confirm-s S`` confirms the bundle's candidates at start-up before serving, within S seconds
(``tunectl.api.confirm_candidates``, which needs torch and the task): at the batch sizes this server runs,
every KV cell of the bundle at its edges (the lengths its requests will reach are not known yet),
and serves each cell at each batch size with the candidate that was fastest here. With
``--confirmed FILE`` too, what it chose is saved to FILE; a server started later with that FILE
applies it (``tunectl.runtime.apply_confirmed``: checked against the bundle and this machine, no
timing) and confirms again only where FILE cannot be applied. A confirmation the budget cut short
is saved too, with the cells it reached: the next start applies it and confirms what is left.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any

from tunectl.runtime import ENV_VAR, Bundle, BundleError, adapters, apply_confirmed, empty_bundle, load_bundle
from tunectl.runtime.confirmed import read_confirmed
from tunectl.runtime.environment import ENV_POLICY_VAR
from tunectl.runtime.sources import uri_scheme

log = logging.getLogger("serve")
TASK = "decode_attention"
#: the model this server runs: what selects the kernel variant (the bundle's static key)
MODEL = {"dtype": "float32", "num_q_heads": 8, "num_kv_heads": 2, "head_dim": 64, "page_size": 16}
EXIT_STRICT_REFUSED = 3


def load(policy: str) -> Bundle:
    """The bundle named by $TUNECTL_BUNDLE; under strict a bad one exits, otherwise it is replaced by none."""
    source = os.environ.get(ENV_VAR)
    fetcher: Any = None
    if source and uri_scheme(source) not in (None, "file"):
        from tunectl.store.stores import fetch  # pyarrow is imported only when a URI is read

        fetcher = fetch
    try:
        bundle = load_bundle(source, env_policy=policy, fetcher=fetcher)
    except BundleError as exc:
        if policy == "strict":
            log.critical("refusing to serve: %s", exc)
            raise SystemExit(EXIT_STRICT_REFUSED) from None
        log.error("no tuned configs (%s); decoding with the kernel's defaults", exc)
        return empty_bundle(str(exc))
    log.info("loaded bundle %s", bundle.summary())
    log.info("bundle environment: %s", bundle.manifest.get("environment"))
    for task in bundle.tasks:
        info = bundle.task_info(task)
        dims = ", ".join(f"{p}:{d['policy']}" for p, d in info["shape_params"].items())
        log.info("task %s: %d entries over %s", task, bundle.manifest["tasks"][task]["num_entries"], dims)
    for problem in bundle.environment_problems:
        log.warning("bundle environment differs: %s", problem)
    return bundle


#: the batch sizes this server runs, in the order its steps meet them
BATCHES = (1, 3, 4, 9, 16, 2)


def requests(num_steps: int, start_kv_len: int) -> list[tuple[int, int]]:
    """(batch, kv_len) per step: batches come and go, contexts grow by one token per step."""
    return [(BATCHES[i % len(BATCHES)], start_kv_len + i) for i in range(num_steps)]


def confirmed(bundle: Bundle, seconds: float, saved: str = "") -> Bundle:
    """``bundle`` with its candidates confirmed at this server's batch sizes, every KV cell at its
    edges, within ``seconds`` (module doc), going on from what ``saved`` holds; the bundle as it was
    where there is nothing to confirm or confirming failed."""
    before = _kept(bundle, saved)
    if before is not None and (not before.get("not_reached") or seconds <= 0 or TASK not in bundle.tasks):
        return _applied(bundle, saved)
    if seconds <= 0 or TASK not in bundle.tasks:
        return bundle
    from tunectl import api
    from tunectl.api.errors import OptionError

    shapes = [{"batch": b} for b in sorted(set(BATCHES))]
    options = api.ConfirmOptions(static=MODEL, device="cpu", budget_s=seconds)
    resume = saved if before is not None else None  # a file that could not be read: from the start
    try:
        done = api.confirm_candidates(bundle, TASK, shapes, options, resume=resume)
    except Exception as exc:  # confirming only refines the bundle's picks: it never stops the server
        log.error(
            "could not confirm the candidates (%s: %s); serving the bundle's picks", type(exc).__name__, exc
        )
        return bundle
    for report in done.reports:
        log.debug("confirm %s", report.line())
    log.info(
        "confirmed the candidates at %d of %d shape(s) in %.1f s: %d cell(s) run another config than the "
        "bundle's pick (%d cell(s) confirmed before, %d left)",
        sum(1 for r in done.reports if r.timed),
        len(done.reports),
        done.seconds,
        len(done.picks),
        done.resumed,
        sum(r.skipped for r in done.reports),
    )
    if saved:  # a part is kept too: the next start goes on from it
        try:
            api.save_confirmed(done, bundle, saved)
        except OptionError as exc:  # the next start confirms again; this one serves what it confirmed
            log.error("cannot save the confirmed picks: %s", exc)
        else:
            log.info("saved the confirmed picks to %s", saved)
    return done.bundle


def _applied(bundle: Bundle, saved: str) -> Bundle:
    """``bundle`` answering the confirmed picks at ``saved``; as it was where they cannot be applied."""
    try:
        applied = apply_confirmed(bundle, saved)
    except BundleError as exc:
        log.error("cannot apply the confirmed picks (%s); serving the bundle's picks", exc)
        return bundle
    log.info("applied the confirmed picks in %s", saved)
    return applied


def _kept(bundle: Bundle, saved: str) -> dict[str, Any] | None:
    """What the confirmed picks at ``saved`` hold for this bundle and machine (``read_confirmed``); None
    where there are none, or they cannot be used (said, and confirmed again)."""
    if not saved or not os.path.exists(saved):
        return None
    try:
        return read_confirmed(bundle, saved)
    except BundleError as exc:
        log.error("cannot apply the confirmed picks (%s); confirming again", exc)
        return None


def serve(bundle: Bundle, num_steps: int, start_kv_len: int) -> dict[str, int]:
    """Run the decode loop; returns how many steps ran tuned and how many on defaults."""
    from tunectl.tasks.decode_attention import DecodeAttention, split_kv_decode

    task = DecodeAttention()
    counts = {"tuned": 0, "default": 0}
    for step, (batch, kv_len) in enumerate(requests(num_steps, start_kv_len)):
        shape = {"batch": batch, "kv_len": kv_len}
        call = adapters.call(bundle, TASK, **MODEL, **shape)
        inputs = task.build_inputs(MODEL, shape, "cpu")  # stands in for the server's live KV cache
        started = time.perf_counter()
        out = split_kv_decode(inputs, **call.kwargs)
        took_us = (time.perf_counter() - started) * 1e6
        counts["tuned" if call.tuned else "default"] += 1
        log.info(
            "step %d batch=%d kv_len=%d %s %s -> %s in %.0f us",
            step,
            batch,
            kv_len,
            "tuned" if call.tuned else "default",
            call.kwargs,
            tuple(out.shape),
            took_us,
        )
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=12, help="decode steps to serve")
    parser.add_argument("--kv-len", type=int, default=1000, help="context length at the first step")
    parser.add_argument(
        "--confirm-s", type=float, default=0.0, help="seconds to confirm the candidates at start-up (0: none)"
    )
    parser.add_argument(
        "--confirmed", default="", help="confirmed picks: applied if the file is there, else saved to it"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    policy = os.environ.get(ENV_POLICY_VAR) or "warn"
    bundle = confirmed(load(policy), args.confirm_s, args.confirmed)
    counts = serve(bundle, args.steps, args.kv_len)
    log.info("served %d steps: %d tuned, %d on defaults", args.steps, counts["tuned"], counts["default"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
