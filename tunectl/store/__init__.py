"""Where results and bundles live: the Parquet results store, run manifests, bundles and channels."""
