"""salience transport adapter (being written)."""

from fastapi import APIRouter

router = APIRouter()
