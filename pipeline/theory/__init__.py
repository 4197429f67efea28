"""The theory lab: train small contrastive models and test the norm-dynamics formula of docs/theory.md."""
