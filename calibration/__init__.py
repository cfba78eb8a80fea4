"""Sim-to-real camera calibration: make the Panda twin's third-person camera match the real one.

The tool ends in one file, the camera file (``vla-camera-v1``, read by
``vla_envs.camera_file.load_camera_file``): the camera's intrinsics and its pose
in the robot base frame, ``T_base_from_cam``. The steps, each a module:

    board.py        the ChArUco board spec (``board.json``); printout.py prints it at true scale
    detection.py    ChArUco corners in an image and the board's pose in the camera
    intrinsics.py   camera matrix and distortion from board images (or a factory K)
    hand_eye.py     camera-to-robot transform from robot poses and board poses, several
                    OpenCV solvers cross-checked, residuals with a pass/fail threshold
    session.py      the recorded session folder a solve reads (and a live collector writes)
    collect.py      live collection: scripted poses inside the safety limits, reached through the
                    SafetyLayer, a frame at rest per pose -> a session folder
    camera_file.py  writing the camera file atomically, with the calibration report in it
    synthetic.py    rendered board views with known poses: tests and ``vla-calibrate selftest``
    overlay.py      the twin rendered from the camera file over a real frame; robot-silhouette offset
    drift.py        a pinned view of a fixed board; has the camera moved since (``check_drift``)?
    cli.py          ``vla-calibrate board | intrinsics | handeye | overlay | drift | selftest``

Frames are named in transforms: ``T_a_from_b`` maps points in frame ``b`` to frame ``a``
(4x4, metres). ``base`` is the robot base, ``ee`` the robot frame the poses are recorded in
(flange or TCP), ``board`` the ChArUco board (origin at its outer top-left corner, x along the
squares_x side, y along squares_y, z into the board), ``cam`` the camera with OpenCV axes
(x right, y down, z forward). OpenCV is imported only where it is used.
"""
