"""Side effects, as classes whose constructors take adapters (DESIGN.md house style 2)."""
