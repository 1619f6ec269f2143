"""The life of a run around its work: the checks before launch and the dispatch (`launch`), run
directories, locks and status (`rundir`), the metrics log, progress and atomic files (`runlog`), trained
runs as models (`trained`: `from_run=`, `init_from=`), the `--dry-run` plan (`plan`) and sweeps (`sweep`)."""
