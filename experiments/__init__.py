"""The experiment machinery: calibration, the real-node experiment, the multi-seed report.

Why a package of its own: these are long, stateful jobs (processes,
cgroups, Docker, NATS, files) that the CLI only starts and reports on; the
control core and the services never depend on them. Each job takes an
options dataclass and a `log` function for progress, and returns its result
as data plus the Markdown it writes into docs/ (between generated markers).
Figures are the dashboard's Altair figure functions (`dashboard.views`),
rendered to files offline by `dashboard.render`.
"""
