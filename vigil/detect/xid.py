"""The Xid table lives in ``vigil.knowledge.xid``; these names stay importable from here for the log library."""

from vigil.knowledge.xid import XidInfo, XidLine, known_xids, parse_xid_line, xid_info

__all__ = ["XidInfo", "XidLine", "known_xids", "parse_xid_line", "xid_info"]
