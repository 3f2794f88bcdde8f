// scaffold
