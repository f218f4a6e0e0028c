"""ms-swift plugin file: ``--external_plugins <this file>`` registers the ``toolrollout`` scheduler
and the ``toolrollout_weight_sync`` trainer callback.

ms-swift puts this file's folder on ``sys.path``; the folder holds nothing else, so no
module here can shadow an installed package. The path is in
``toolrollout.integrations.SWIFT_PLUGIN_PATH``.
"""

import toolrollout.integrations._swift  # noqa: F401  (registers multi_turns["toolrollout"])
import toolrollout.integrations._swift_sync as _sync

_sync.register()  # callbacks_map["toolrollout_weight_sync"]: the engine follows the trainer
