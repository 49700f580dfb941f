"""The engine: BART in plain PyTorch and its generation (`model`, `attention`, `cross_attention`, `el_attention`,
`cache`, `generation`, `static_generation`, `graphs`, `buffers`, `packing`, `processors`, `kernels`, `native`,
`quantize`), what it loads (`loading`, `checkpoint`, `config`, `fingerprint`), and what it is told and measures
(`options`, `spec`, `hardware`, `inputs`, `memory`). It never imports the pipeline. Importing this package loads
nothing: `bart-opt --help` reads `options` through it without torch."""
