# Env options shared by the main job's stages (sourced): procedural assets, low-poly Panda, the
# camera cropped to the workspace. The warm start, PPO (see the recipe) and evaluation see the same.
ENV_KWARGS='{"low_poly": true, "assets": "procedural", "camera_crop": [190, 80, 460, 350]}'
