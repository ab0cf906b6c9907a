"""SGLang's dialect: its server flag table (package data generated from SGLang's own parser), the
launch-command parser, the mapping onto specctl's Deployment model, SGLang-specific rules, model
families, and import/export. Torch- and sglang-free: `specctl validate` imports it."""
