"""Model zoo data: one TOML file per architecture (loaded by estimators.model_config.load_model)."""
