"""``python -m bart_opt.bench``: the same as ``bart-opt bench``."""

from bart_opt.bench import main

raise SystemExit(main())
