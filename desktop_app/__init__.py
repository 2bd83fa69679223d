"""Folio's desktop app, in layers: a module imports only from the layers below its own.

- ``main_window`` composes everything; ``__main__`` starts the app (``folio-app``).
- ``dialogs``: the modal windows (the error dialog, settings, the model manager).
- ``controllers``: chat turns, between the store, the engine bridge and the view (a
  ``ChatSession`` per open or streaming chat, the ``ChatController`` routing to them).
- ``widgets``: the pieces of the window and the theme; they import no other layer and
  read the store's records and the engine's snapshots only through the objects they
  are handed.
- ``services``: the GUI's links to the outside: the engine (``engine_bridge`` over a
  ``worker_protocol.ModelWorker``, ``local_worker``), remote
  OpenAI-compatible servers as a model source (``remote``, ``remote_request``,
  ``remote_pacing``, ``remote_client``, ``remote_metrics``), the app's own API on localhost
  (``api_server``) and the Hugging Face hub (``downloads``), and the MCP servers'
  tools (``tools_bridge``).
- ``mcp``: MCP servers from ``mcp.json``, on their own asyncio thread, with typed events
  (no Qt, like ``data``).
- ``data``: chats in SQLite and settings in JSON. No Qt, so the store and the settings
  load in scripts and tests without a display.
"""
