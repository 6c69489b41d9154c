"""``moetune serve``: a local web page and JSON API over the moetune commands (extra ``moetune[web]``).

- :mod:`moetune.web.app` — the Starlette application: the page at ``/``, its assets, the JSON API
  (``/api/<command>``: the CLI's flags in, the command's ``--json`` object out, 4xx with the CLI's one-line message)
  and ``/ui/charts`` (the report's SVG charts for a result the page holds).
- :mod:`moetune.web.uploads` — request parsing; uploads size-capped into a per-request temp dir.
- ``moetune/web/static/`` — the page (HTML, CSS, JS); shipped in the wheel, no CDN, no network.
"""
