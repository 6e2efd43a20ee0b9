"""ViT trainability sweeps (the paper's §5 / App. D) and the loss-from-exponents predictor.

model    the ViT built from the shared :class:`phasefield.block.Block`
data     digits (bundled) / tensorflow-datasets image classification, cached as .npz
train    pure ``train(point, ...)`` vmapped over hyperparameter points, sharded over devices
sweep    resumable grid sweeps with metrics, results tables and orbax checkpoints
predict  loss = min(log C, b + max(w_a|lambda_a - c_a|, w_g|lambda_g - c_g|)) and baselines
figure   the paper's Fig. 7
study    the trainability study the shipped predictors were fitted on (scripts/trainability_study.py)
"""
