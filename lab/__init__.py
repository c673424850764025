"""The project's research tools, run from the checkout as `python -m lab ACTION` (lab/cli.py).

Not part of the product: the wheel leaves this package out and no product
module imports it (.importlinter). The lab imports the product freely.
"""
