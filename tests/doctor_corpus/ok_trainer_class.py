"""A small Trainer class; validation under `torch.set_grad_enabled(False)`, train-set accuracy
measured in eval mode after each epoch."""
# expect: none

import torch


class Trainer:
    def __init__(self, model, optimizer, criterion, device):
        self.model = model.to(device)
        self.optimizer = optimizer
        self.criterion = criterion
        self.device = device
        self.history = []

    def _run(self, loader, train):
        self.model.train(train)
        total, hits = 0, 0
        with torch.set_grad_enabled(train):
            for x, y in loader:
                x, y = x.to(self.device), y.to(self.device)
                out = self.model(x)
                if train:
                    self.optimizer.zero_grad()
                    self.criterion(out, y).backward()
                    self.optimizer.step()
                hits += (out.argmax(1) == y).sum().item()
                total += len(y)
        return hits / total

    def train_accuracy(self, loader):
        return self._run(loader, train=False)


def fit(model, optimizer, loss_fn, train_loader, val_loader, epochs, device):
    trainer = Trainer(model, optimizer, loss_fn, device)
    for _ in range(epochs):
        trainer._run(train_loader, train=True)
        trainer.history.append(
            (trainer.train_accuracy(train_loader), trainer._run(val_loader, train=False))
        )
    return trainer.history
