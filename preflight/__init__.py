"""Live preflight: ask two running servers (prefill and decode) what they will do, before any traffic.

Torch-free and engine-neutral. `reader` fetches a server's `/server_info` and `/model_info` (and
prefill's bootstrap `GET /route`), `facts` normalises either shape -- SGLang 0.5.23's and specctl's
own -- into one typed `ServerFacts`, `diff` compares prefill with decode (and each with what a
deployment asked for) into rows of (field, prefill value, decode value, fix), and `check` runs the
whole thing for `specctl preflight` and for `specctl up`.
"""
