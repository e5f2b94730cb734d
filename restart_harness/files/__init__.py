"""The storage layer: atomic files, exclusive directories, file-system facts, page-cache control and residency,
the storage baseline and the user cache directory. It imports nothing from the rest of the harness, so every other
layer (spec, launch, worker, results, analysis) can use it without an import cycle."""
