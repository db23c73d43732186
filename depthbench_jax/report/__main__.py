"""``python -m depthbench_jax.report RESULTS_DIR [--config=SUITE.py]``: writes report.md,
runs.csv and plots/; with the suite that was swept, also how far its plan is (``report.plan``)."""

import os
import sys

from depthbench_jax.errors import ConfigError, OneLineParser, fail
from depthbench_jax.report.scorecard import write_report
from depthbench_jax.train.summary import check_folder


def main(argv=None) -> int:
  p = OneLineParser(prog="python -m depthbench_jax.report")
  p.add_argument("results_dir", help="a sweep's results folder, e.g. results/suite_400m")
  p.add_argument("--out", default=None, help="where to write (default: RESULTS_DIR)")
  p.add_argument("--no_plots", action="store_true")
  p.add_argument("--config", default=None,
                 help="the suite file swept into RESULTS_DIR (e.g. configs/suite_400m.py): the "
                      "report then counts its planned runs and marks those not started")
  args = p.parse_args(argv)
  if not os.path.isdir(args.results_dir):
    fail(f"results_dir {args.results_dir}: no such directory; allowed: a sweep's results "
         f"folder, e.g. results/smoke")
  try:  # A bad --out or --config fails before anything is written.
    if args.out:
      check_folder(args.out, f"--out={args.out}")
    if not args.no_plots:   # a file there was a FileExistsError traceback and no report.md
      check_folder(os.path.join(args.out or args.results_dir, "plots"),
                   f"--out={args.out}" if args.out else f"results_dir {args.results_dir}")
    paths = write_report(args.results_dir, out_dir=args.out, plots=not args.no_plots,
                         config_path=args.config)
  except ConfigError as err:
    fail(str(err))
  if paths is None:
    print(f"no run under {args.results_dir}; nothing to report", file=sys.stderr)
    return 1
  for path in paths:
    print(path)
  return 0


if __name__ == "__main__":
  sys.exit(main())
