"""Data in and out in other programs' layouts: bundle export, serving engines' config files, Inductor logs."""
