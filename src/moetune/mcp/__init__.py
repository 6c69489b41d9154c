"""moetune as a Model Context Protocol server (``moetune mcp``; extra ``moetune[mcp]``).

* :mod:`moetune.mcp.tools` — one tool per command, arguments and results exactly the CLI's (``moetune.service``);
* :mod:`moetune.mcp.resources` — the catalogs (models, systems, Bridge recipes, rules, efficiency parameters);
* :mod:`moetune.mcp.prompts` — the tuning workflows as guided sequences of tool calls;
* :mod:`moetune.mcp.server` — the SDK server, its root-folder confinement, time limits and progress.

Only :mod:`moetune.mcp.server` imports the MCP SDK.
"""
