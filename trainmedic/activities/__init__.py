"""Side effects, as classes whose constructors take adapters (docs/architecture.md "Layers")."""
