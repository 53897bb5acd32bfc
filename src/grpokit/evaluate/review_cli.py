"""The ``grpokit review`` command; the top-level ``grpokit`` group adds it."""

from __future__ import annotations

import getpass
from pathlib import Path

import click

from grpokit.cli_options import config_option, seed_option


def _default_reviewer() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name in some containers
        return "reviewer"


@click.command("review")
@click.argument("source", metavar="DIR", type=click.Path(path_type=Path))
@click.option(
    "--reviewer",
    default=None,
    help="Your name in the labels, which keep reviewers apart; default: your login name.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=0,
    help="Port on 127.0.0.1; default: a free one.",
)
@seed_option(
    "Seed of the review order, recorded in the label database when it is created (default: a "
    "random one); later sessions keep the recorded order.",
    default=None,
)
@config_option(
    "A grpokit config whose checklist items are graded; default: DIR's config.yaml (a run), "
    "else the items named in the samples' scores, else one 1-5 score."
)
@click.option(
    "--db",
    type=click.Path(path_type=Path),
    default=None,
    help="The label database; default DIR/review.sqlite (FILE.review.sqlite for a generate file).",
)
@click.option(
    "--report",
    is_flag=True,
    help="Print the agreement of each reviewer with each judge, reward model and program reward "
    "(kappa per checklist item, Spearman overall, 95% intervals) instead of serving the page.",
)
@click.option(
    "--export-pairs",
    type=click.Path(path_type=Path),
    default=None,
    help="Write preference pairs (JSONL: prompt, chosen, rejected) from the labels.",
)
@click.option(
    "--export-rm",
    type=click.Path(path_type=Path),
    default=None,
    help="Write a reward-model training set (JSONL: TRL's conversational prompt, chosen, "
    "rejected and margin) from the labels.",
)
def review_cmd(
    source: Path,
    reviewer: str | None,
    port: int,
    seed: int | None,
    config: Path | None,
    db: Path | None,
    report: bool,
    export_pairs: Path | None,
    export_rm: Path | None,
) -> None:
    """Grade samples by hand, blind, on a local web page; compare the grades with the judges.

    DIR is a run directory, a `grpokit eval` output or a `grpokit generate --out` file. The page
    shows one sample at a time, model and step hidden, in a shuffled order; it grades each
    checklist item yes/no (or gives one 1-5 score) and takes a note. Labels are saved in SQLite
    in DIR as they are given: stop with Ctrl-C, run again, and the page resumes at the first
    sample you have not labelled.
    """
    from grpokit.errors import UserError
    from grpokit.evaluate.review_agreement import (
        agreement,
        agreement_text,
        labelled_pairs,
        person_scores,
        preference_rows,
        reward_model_rows,
    )
    from grpokit.evaluate.review_data import (
        LabelStore,
        checklist_items,
        find_samples,
        items_from_scores,
        load_config_file,
    )
    from grpokit.files import write_jsonl

    found = find_samples(source)
    if config is not None:
        items = checklist_items(load_config_file(config), str(config))
    else:
        items = checklist_items(found.config, str(found.path / "config.yaml"))
    if not items:
        items = items_from_scores(found.samples)
    offline = report or export_pairs is not None or export_rm is not None
    store = LabelStore.open(found, items, seed=seed, db_path=db, create=not offline)
    if seed is not None and seed != store.seed:
        click.echo(f"note: {store.path} keeps the order of its own seed {store.seed}", err=True)
    if offline:
        if report:
            rows = agreement(found.samples, store)
            labels = store.labels()
            click.echo(
                f"{len(labels)} label(s) by {len(store.reviewers())} reviewer(s) in {store.path}"
            )
            click.echo(agreement_text(rows) if rows else "too few labels to compare (2 or more)")
        pairs = labelled_pairs(found.samples, person_scores(found.samples, store))
        for path, rows_of, what in ((export_pairs, preference_rows, "preference pairs"),
                                    (export_rm, reward_model_rows, "reward-model pairs")):  # fmt: skip
            if path is None:
                continue
            if not pairs:
                raise UserError(
                    f"no pairs to export: they need two labelled samples of one prompt with "
                    f"different scores ({len(store.labels())} label(s) in {store.path})"
                )
            write_jsonl(path, rows_of(pairs))
            click.echo(f"{what}: {len(pairs)} in {path}")
        return

    from grpokit.evaluate.review_server import ReviewApp, make_server, serve_until_stopped

    who = reviewer or _default_reviewer()
    app = ReviewApp(store, found.samples, who)
    server = make_server(app, port)
    state = app.state()
    mode = f"{len(store.items)} checklist item(s)" if store.items else "one 1-5 score"

    def ready() -> None:
        click.echo(
            f"review: http://127.0.0.1:{server.server_port}/  ({state['total']} samples, "
            f"{state['labelled']} labelled by {who}; {mode}; labels in {store.path})"
        )
        click.echo("stop with Ctrl-C; the labels are saved as you go", err=True)

    serve_until_stopped(server, ready)  # Ctrl-C or SIGTERM
    click.echo(f"stopped; {len(store.labels(who))} label(s) by {who} in {store.path}")
