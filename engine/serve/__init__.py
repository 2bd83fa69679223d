"""``folio serve``: an OpenAI-compatible HTTP API over one EngineWorker.

``app.py`` holds the routes, ``protocol.py`` the request bodies, ``responses.py`` the
response bodies and streamed chunks, ``streaming.py`` the bridge from the engine's thread
to the event loop, ``errors.py`` the error objects, ``limits.py`` the body size limit,
``host_guard.py`` the Host and Origin checks (DNS rebinding, CORS), ``api_key.py`` the key,
``unicode_text.py`` text that is not Unicode, ``disconnect.py`` clients that leave,
``metrics.py`` Prometheus' figures, ``server.py`` how it runs (loopback by default) and
``slow_clients.py`` connections whose request head is slow.
"""
